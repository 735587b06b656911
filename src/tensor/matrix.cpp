#include "tensor/matrix.h"

#include <cmath>
#include <cstring>

#include "core/enum_names.h"
#include "tensor/dtype.h"

namespace deltafin {

const float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

namespace {
struct E8M0Table {
  float v[256];
  E8M0Table() {
    for (int e = 0; e < 256; ++e) v[e] = e == 255 ? NAN : std::ldexp(1.0f, e - 127);
  }
};
const E8M0Table kE8M0;

// FP8 E4M3FN: (8 + m) * 2^(e - 10) for e >= 1, m * 2^-9 for e = 0 (ldexp of a small integer:
// exact), NaN for the two all-ones codes.
struct E4M3Table {
  float v[256];
  E4M3Table() {
    for (int c = 0; c < 256; ++c) {
      const int e = (c >> 3) & 0xF, m = c & 7;
      float a = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                       : std::ldexp(static_cast<float>(8 + m), e - 10);
      if (e == 15 && m == 7) a = NAN;
      v[c] = (c & 0x80) ? -a : a;
    }
  }
};
const E4M3Table kE4M3;
}  // namespace

float e8m0_to_float(uint8_t e) {
  return kE8M0.v[e];
}

float e4m3_to_float(uint8_t code) {
  return kE4M3.v[code];
}

constexpr EnumName<WeightFormat> kWeightFormatNames[] = {
    {WeightFormat::kF32, "f32"},   {WeightFormat::kBF16, "bf16"}, {WeightFormat::kMXFP4, "mxfp4"},
    {WeightFormat::kInt8, "int8"}, {WeightFormat::kFP8, "fp8"},   {WeightFormat::kInt4, "int4"},
};

const char* weight_format_name(WeightFormat f) {
  return name_of(kWeightFormatNames, f);
}

float matrix_element(const Matrix& m, int64_t r, int64_t c) {
  const uint8_t* row = static_cast<const uint8_t*>(m.data) + r * m.row_bytes();
  switch (m.format) {
    case WeightFormat::kF32: {
      float v;
      std::memcpy(&v, row + c * 4, 4);
      return v;
    }
    case WeightFormat::kBF16: {
      uint16_t h;
      std::memcpy(&h, row + c * 2, 2);
      return bf16_to_f32(h);
    }
    case WeightFormat::kMXFP4: {
      uint8_t b = row[c / 2];
      uint8_t code = (c & 1) ? (b >> 4) : (b & 0xF);
      uint8_t e = m.scale_row(r)[c / 32];
      return kE2M1Values[code] * e8m0_to_float(e);
    }
    case WeightFormat::kInt8: {
      int8_t q = static_cast<int8_t>(row[c]);
      uint16_t s;
      std::memcpy(&s, m.scales + r * 2, 2);
      return static_cast<float>(q) * f16_to_f32(s);
    }
    case WeightFormat::kFP8: {
      float s;
      std::memcpy(&s, m.scale_row(r) + c / kFp8Block * 4, 4);
      return e4m3_to_float(row[c]) * s;  // one float32 rounding of the exact product
    }
    case WeightFormat::kInt4: {
      const int q = static_cast<int>((row[c / 2] >> (c % 2 * 4)) & 0xF) - 8;
      uint16_t s;
      std::memcpy(&s, m.scale_row(r) + c / kInt4Group * 2, 2);
      return static_cast<float>(q) * bf16_to_f32(s);  // exact: 4-bit x 8-bit significands
    }
  }
  return 0.0f;
}

}  // namespace deltafin
