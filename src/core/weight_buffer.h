// Page-aligned heap buffers for weights read from disk (resident trunk layers, stream buffers,
// expert slots). Buffers of 2 MiB or more are 2 MiB aligned and advised as transparent huge
// pages where the kernel offers them: weights are streamed through once per pass, and with 4 KiB
// pages every 4 KiB of a GEMV costs a TLB miss. Sizes are what the memory plan counts; O_DIRECT
// reads into them work either way. Free with std::free.
#pragma once

#include <cstdint>

namespace deltafin {

// Throws Error ("cannot allocate N bytes for WHAT") when the allocation fails.
uint8_t* alloc_weight_buffer(uint64_t bytes, const char* what);

}  // namespace deltafin
