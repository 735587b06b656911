// Pillow 9.4's `Image.resize(size, BICUBIC)`, bit for bit (docs/VISION.md §3.4), written from the
// algorithm as the doc states it (not from Pillow's source): separable fixed-point bicubic with
// 22-bit weights, horizontal pass first, 8-bit rounding between and after the passes; alpha
// premultiplied around the resample for RGBA and LA; nearest neighbour for P and 1 (indices
// resized, palette and transparency kept); the same size gives a copy.
//
// The reference processor resizes with Pillow, so only an integer re-implementation that is
// exact gives the reference's pixels; tools/vision/k3_vision_pre.py's `resize_exact` is the same
// algorithm in numpy, proven equal to Pillow by tools/vision/selfcheck.py, and the tests compare
// this code with the reference's output on every test image.
#pragma once

#include <cstdint>
#include <vector>

#include "vision/image.h"

namespace deltafin::vision {

// The image as Pillow's resize to new_w × new_h with the BICUBIC filter returns it.
Image resize_bicubic(const Image& im, int64_t new_w, int64_t new_h);

// One separable pass's fixed-point weights (exposed for tests): for output index o, the taps
// start at `start[o]`, there are `count[o]` of them, weights `weights[o * ksize + i]`.
struct ResampleTaps {
  int64_t ksize = 0;
  std::vector<int64_t> start, count;
  std::vector<int32_t> weights;
};
ResampleTaps bicubic_taps(int64_t in_size, int64_t out_size);

}  // namespace deltafin::vision
