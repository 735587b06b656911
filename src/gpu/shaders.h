// The SPIR-V modules compiled from src/gpu/shaders by glslc at build time and embedded by
// cmake/embed_spirv.cmake (present only in builds with Vulkan: DELTAFIN_HAVE_VULKAN).
#pragma once

#include <cstddef>
#include <span>

namespace deltafin::gpu {

struct ShaderModule {
  const char* name;  // matmul_bf16, grouped_mxfp4, ...
  const unsigned char* code;
  size_t size;
};

std::span<const ShaderModule> shader_modules();

}  // namespace deltafin::gpu
