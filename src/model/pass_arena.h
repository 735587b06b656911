// Scratch memory that a forward pass hands from sub-layer to sub-layer (KDA, then the MoE, then
// the next layer's KDA, ...), so that after the first layer a sub-layer's buffers are neither
// allocated, zeroed nor faulted in again. Fresh buffers of that size come from mmap every time:
// the kernel zeroes their pages on first touch and std::vector zeroes them again, so every
// sub-layer of every layer would zero its scratch twice, on one thread while the others wait.
//
// Each sub-layer begins with reset() and then takes its buffers; what one sub-layer took is dead
// once the next resets. So the arena holds at most the largest sub-layer's scratch, which is what
// the prefill planner counts (pass_plan.cpp: the max over the sub-layers), and it is freed with the
// pass. Buffers come uninitialised: a caller writes every element before reading it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace deltafin {

class PassArena {
 public:
  // Ends the previous sub-layer's use: everything taken before is dead from here on.
  void reset();
  // n floats, 64-byte aligned, uninitialised; valid until the next reset().
  float* take(int64_t n);

 private:
  struct Block {
    std::unique_ptr<float[], void (*)(float*)> p{nullptr, nullptr};
    size_t cap = 0;  // floats
  };
  std::vector<Block> blocks_;  // one once the arena has met its largest sub-layer
  size_t used_ = 0;            // floats taken from the last block
  size_t taken_ = 0;           // floats taken since reset(), over all blocks
  size_t want_ = 0;            // the most taken between two resets
};

}  // namespace deltafin
