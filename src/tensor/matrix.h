// A non-owning view of a weight matrix W[rows, cols] (HF layout: row = output, col = input),
// in one of the formats the kernels understand. Nothing here allocates: the bytes belong to a
// mapped shard, the expert cache or a converted copy owned elsewhere.
//
// Formats:
//   kF32    data: float[rows][cols]
//   kBF16   data: uint16[rows][cols]
//   kMXFP4  data: uint8[rows][cols/2] (low nibble = even column), scales: E8M0 uint8[rows][cols/32]
//   kInt8   data: int8[rows][cols], scales: f16 uint16[rows] (lossy --trunk int8 only)
//   kFP8    data: FP8 E4M3FN codes uint8[rows][cols]; scales: F32 [ceil(rows/128)][ceil(cols/128)],
//           DeepSeek-V3 / Kimi K2's `weight_scale_inv` (a multiplier despite its name): W[r, c] =
//           e4m3(code) * scale[r/128][c/128], the product rounded once to float32. Edge blocks are
//           ragged. Scales are per block of 128 rows, so a row slice that starts inside a block
//           keeps `row_phase` (where its row 0 sits in that block) and points at that block's row.
//   kInt4   data: uint32 words [rows][ceil(cols/8)], compressed-tensors `pack-quantized`: column
//           8j+i in bits 4i..4i+3 of word j (little-endian, so byte c/2, low nibble for even c),
//           stored as q + 8 (q in -8..7); scales: BF16 [rows][ceil(cols/32)]; W = q * scale,
//           exact in float32.
// docs/FAMILY.md ("FP8 E4M3 weights", "INT4 pack-quantized weights") states the two formats;
// tensor/quant.h builds their views from checkpoint tensors with every check.
#pragma once

#include <cstdint>

namespace deltafin {

enum class WeightFormat : uint8_t { kF32, kBF16, kMXFP4, kInt8, kFP8, kInt4 };
// How many formats there are (the kernel tables' arrays are indexed by WeightFormat).
inline constexpr int kWeightFormats = 6;

// The FP8 block edge (rows and columns) and the INT4 group (columns) the kernels take.
inline constexpr int64_t kFp8Block = 128;
inline constexpr int64_t kInt4Group = 32;

const char* weight_format_name(WeightFormat f);

struct Matrix {
  WeightFormat format = WeightFormat::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  const uint8_t* scales = nullptr;
  // kFP8 only: the view's row 0 is row `row_phase` (0..127) of the 128-row block whose scale row
  // `scales` points at. 0 for a whole tensor; row_slice keeps it.
  int64_t row_phase = 0;

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
      case WeightFormat::kFP8:
        return cols;
      case WeightFormat::kInt4:
        return (cols + 7) / 8 * 4;
    }
    return 0;
  }
  // Bytes per row of the scale grid (for kFP8 one scale row covers 128 weight rows).
  int64_t scale_row_bytes() const {
    switch (format) {
      case WeightFormat::kMXFP4:
        return cols / 32;
      case WeightFormat::kInt8:
        return 2;
      case WeightFormat::kFP8:
        return (cols + kFp8Block - 1) / kFp8Block * 4;
      case WeightFormat::kInt4:
        return (cols + kInt4Group - 1) / kInt4Group * 2;
      default:
        return 0;
    }
  }
  // Rows of the scale grid this view reads.
  int64_t scale_rows() const {
    if (format == WeightFormat::kFP8) return (row_phase + rows + kFp8Block - 1) / kFp8Block;
    return scale_row_bytes() != 0 ? rows : 0;
  }
  // The scale row of weight row n.
  const uint8_t* scale_row(int64_t n) const {
    const int64_t i = format == WeightFormat::kFP8 ? (row_phase + n) / kFp8Block : n;
    return scales + i * scale_row_bytes();
  }
  // All scale bytes this view reads (from `scales` on).
  int64_t scale_bytes() const { return scale_rows() * scale_row_bytes(); }
  // All bytes a pass over this matrix reads.
  int64_t bytes() const { return rows * row_bytes() + scale_bytes(); }

  // The sub-matrix of rows [begin, end).
  Matrix row_slice(int64_t begin, int64_t end) const {
    Matrix m = *this;
    m.rows = end - begin;
    m.data = static_cast<const uint8_t*>(data) + begin * row_bytes();
    if (scales != nullptr) m.scales = scale_row(begin);
    if (format == WeightFormat::kFP8) m.row_phase = (row_phase + begin) % kFp8Block;
    return m;
  }
  bool valid() const { return data != nullptr && rows > 0 && cols > 0; }
};

// MXFP4 element decoding (exact): E2M1 code -> value, E8M0 byte -> 2^(e-127) (e = 255 -> NaN).
extern const float kE2M1Values[16];
float e8m0_to_float(uint8_t e);
// FP8 E4M3FN code -> value, exact: sign bit 7, exponent bits 6..3 (bias 7), mantissa bits 2..0;
// exponent 0 is subnormal (m * 2^-9), 0x7F and 0xFF are NaN, 0x7E = 448 the largest; no
// infinities.
float e4m3_to_float(uint8_t code);
// W[r, c] of any format, as float (reference decoding used by tests and scalar kernels).
float matrix_element(const Matrix& m, int64_t r, int64_t c);

}  // namespace deltafin
