#include "tensor/matrix.h"

#include <cmath>
#include <cstring>

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
}  // namespace

float e8m0_to_float(uint8_t e) {
  return kE8M0.v[e];
}

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32:
      return "f32";
    case WeightFormat::kBF16:
      return "bf16";
    case WeightFormat::kMXFP4:
      return "mxfp4";
    case WeightFormat::kInt8:
      return "int8";
  }
  return "?";
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
      uint8_t e = m.scales[r * m.scale_row_bytes() + c / 32];
      return kE2M1Values[code] * e8m0_to_float(e);
    }
    case WeightFormat::kInt8: {
      int8_t q = static_cast<int8_t>(row[c]);
      uint16_t s;
      std::memcpy(&s, m.scales + r * 2, 2);
      return static_cast<float>(q) * f16_to_f32(s);
    }
  }
  return 0.0f;
}

}  // namespace deltafin
