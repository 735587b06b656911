// Element types as they appear in safetensors headers, and the weight formats the kernels take.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace deltafin {

enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool, kF8E4M3, kF8E5M2 };

// "F32", "BF16", ... exactly as safetensors spells them; nullopt for names we do not know.
std::optional<DType> parse_dtype(std::string_view name);
const char* dtype_name(DType t);
// Bytes per element.
size_t dtype_size(DType t);

// bf16 <-> f32. bf16 -> f32 is exact; f32 -> bf16 rounds to nearest even (NaN stays NaN).
inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace deltafin
