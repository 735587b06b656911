// The libFuzzer entry point of one target: each fuzz program is this file compiled with
// DELTAFIN_FUZZ_TARGET naming its body (fuzz/CMakeLists.txt), so every program is one target
// with its own corpus, and the bodies stay testable without libFuzzer.
#include <cstddef>
#include <cstdint>

#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const deltafin::fuzz::Target* target = deltafin::fuzz::find_target(DELTAFIN_FUZZ_TARGET);
  target->body(data, size);
  return 0;
}
