// The options of the GPU backend (gpu.h), apart so that the engine's option structs can hold
// them without including the backend.
#pragma once

#include <cstdint>
#include <string>

namespace deltafin::gpu {

struct Options {
  std::string select = "off";  // auto | N (a device index, see probe) | off
  uint64_t memory = 0;         // device bytes for resident weights; 0 = 3/4 of the device heap
  // Rows from which a product whose weights are not resident is uploaded and run on the device
  // (below it, uploading the weights costs more than the CPU product).
  int64_t min_rows = 16;
  // Caps the bytes of one buffer below the device's limit (0 = the limit); tests use it to
  // exercise the splitting on small shapes.
  uint64_t max_buffer = 0;
  // Copies through the staging buffer and never imports, even where device memory is
  // host-visible (tests: the path of discrete GPUs, on lavapipe).
  bool staged = false;
};

class Backend;

}  // namespace deltafin::gpu
