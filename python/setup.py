# Bundles the C library into the package at install time, so `import deltafin` never has to
# search for it: the library named by $DELTAFIN_LIB (what `make python` passes: the one this
# checkout built) or, without it, build/src/capi/libdeltafin.so next to this folder. ctypes,
# not a compiled extension: nothing to compile at install (no Python headers, no compiler, no
# network), one binding for every Python 3 version, and the C API is the same stable surface
# other languages bind.
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def library_path():
    lib = os.environ.get("DELTAFIN_LIB") or os.path.join(
        HERE, "..", "build", "src", "capi", "libdeltafin.so")
    lib = os.path.realpath(lib)
    if not os.path.isfile(lib):
        raise SystemExit(
            f"deltafin: the C library {lib} does not exist; build it first (make python does "
            "both) or set DELTAFIN_LIB to a built libdeltafin.so")
    return lib


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "deltafin", "libdeltafin.so")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(library_path(), target)


setup(cmdclass={"build_py": BuildWithLibrary})
