// A non-owning view of a weight matrix W[rows, cols] (HF layout: row = output, col = input),
// in one of the formats the kernels understand. Nothing here allocates: the bytes belong to a
// mapped shard, the expert cache or a converted copy owned elsewhere.
//
// Formats:
//   kF32    data: float[rows][cols]
//   kBF16   data: uint16[rows][cols]
//   kMXFP4  data: uint8[rows][cols/2] (low nibble = even column), scales: E8M0 uint8[rows][cols/32]
//   kInt8   data: int8[rows][cols], scales: f16 uint16[rows] (lossy --trunk int8 only)
#pragma once

#include <cstdint>

namespace deltafin {

enum class WeightFormat : uint8_t { kF32, kBF16, kMXFP4, kInt8 };

const char* weight_format_name(WeightFormat f);

struct Matrix {
  WeightFormat format = WeightFormat::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  const uint8_t* scales = nullptr;

  // Bytes per row of `data` (packed, no padding).
  int64_t row_bytes() const {
    switch (format) {
      case WeightFormat::kF32:
        return cols * 4;
      case WeightFormat::kBF16:
        return cols * 2;
      case WeightFormat::kMXFP4:
        return cols / 2;
      case WeightFormat::kInt8:
        return cols;
    }
    return 0;
  }
  int64_t scale_row_bytes() const {
    switch (format) {
      case WeightFormat::kMXFP4:
        return cols / 32;
      case WeightFormat::kInt8:
        return 2;
      default:
        return 0;
    }
  }
  // All bytes a pass over this matrix reads.
  int64_t bytes() const { return rows * (row_bytes() + scale_row_bytes()); }

  // The sub-matrix of rows [begin, end).
  Matrix row_slice(int64_t begin, int64_t end) const {
    Matrix m = *this;
    m.rows = end - begin;
    m.data = static_cast<const uint8_t*>(data) + begin * row_bytes();
    if (scales != nullptr) m.scales = scales + begin * scale_row_bytes();
    return m;
  }
  bool valid() const { return data != nullptr && rows > 0 && cols > 0; }
};

// MXFP4 element decoding (exact): E2M1 code -> value, E8M0 byte -> 2^(e-127) (e = 255 -> NaN).
extern const float kE2M1Values[16];
float e8m0_to_float(uint8_t e);
// W[r, c] of any format, as float (reference decoding used by tests and scalar kernels).
float matrix_element(const Matrix& m, int64_t r, int64_t c);

}  // namespace deltafin
