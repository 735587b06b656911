// The GPU tests' way to get a device (gpu_test.cpp, gpu_quant_test.cpp): the first Vulkan device
// (lavapipe on CI and on machines without a GPU), or a skip that says why there is none, so the
// tests pass cleanly on a build without Vulkan or a machine without a device.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "gpu/gpu.h"

// The first Vulkan device (lavapipe here), or a skip naming why there is none.
#define DELTAFIN_GPU_OR_SKIP(var, ...)                                                \
  std::unique_ptr<gpu::Backend> var;                                                  \
  {                                                                                   \
    gpu::Probe probe_ = gpu::probe();                                                 \
    if (!gpu::compiled_in()) GTEST_SKIP() << "built without the Vulkan backend";      \
    if (probe_.devices.empty()) GTEST_SKIP() << "no Vulkan device: " << probe_.error; \
    gpu::Options o_{"0", 0, 1, 0};                                                    \
    __VA_ARGS__;                                                                      \
    std::string line_;                                                                \
    var = gpu::Backend::open(o_, line_);                                              \
    ASSERT_TRUE(var) << line_;                                                        \
  }
