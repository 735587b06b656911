// The demo checkpoint's bytes, embedded with the assembler's .incbin so the binary needs no data
// files at run time and the build needs no generator step. DELTAFIN_DEMO_ARCHIVE is the
// absolute path of assets/demo/k3-demo.tar.gz, set by src/cli/CMakeLists.txt (which also
// makes this file recompile when the archive changes; ccache declines to cache .incbin).
#ifndef DELTAFIN_DEMO_ARCHIVE
#error "DELTAFIN_DEMO_ARCHIVE must name the demo archive (set by CMake)"
#endif

asm(".section .rodata\n"
    ".global deltafin_demo_begin\n"
    ".balign 16\n"
    "deltafin_demo_begin:\n"
    ".incbin \"" DELTAFIN_DEMO_ARCHIVE
    "\"\n"
    ".global deltafin_demo_end\n"
    "deltafin_demo_end:\n"
    ".byte 0\n"
    ".previous\n");
