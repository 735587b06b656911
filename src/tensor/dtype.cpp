#include "tensor/dtype.h"

#include <cmath>

namespace deltafin {

std::optional<DType> parse_dtype(std::string_view n) {
  if (n == "F64") return DType::kF64;
  if (n == "F32") return DType::kF32;
  if (n == "F16") return DType::kF16;
  if (n == "BF16") return DType::kBF16;
  if (n == "I64") return DType::kI64;
  if (n == "I32") return DType::kI32;
  if (n == "I16") return DType::kI16;
  if (n == "I8") return DType::kI8;
  if (n == "U8") return DType::kU8;
  if (n == "BOOL") return DType::kBool;
  if (n == "F8_E4M3") return DType::kF8E4M3;
  if (n == "F8_E5M2") return DType::kF8E5M2;
  return std::nullopt;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF64:
      return "F64";
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI16:
      return "I16";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E5M2:
      return "F8_E5M2";
  }
  return "?";
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return 1;
  }
  return 1;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {                                               // subnormal or zero
    float a;
    std::memcpy(&a, &absx, sizeof a);
    // round(a * 2^24) with ties to even
    float scaled = a * 16777216.0f;
    uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t exp = (absx >> 23) - 112;
  uint32_t mant = absx & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

}  // namespace deltafin
