// The views and checks of tensor/quant.h. Every message names the tensor, what it holds and what
// was expected, because these tensors come from files that are hostile until checked.
#include "tensor/quant.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "tensor/dtype.h"

namespace deltafin {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

std::string described(const TensorInfo& t) {
  return std::string(dtype_name(t.dtype)) + t.shape_string();
}

void expect(const TensorInfo& t, DType dtype, std::array<int64_t, 2> shape, const char* what) {
  if (t.dtype != dtype || t.shape.size() != 2 || t.shape[0] != shape[0] || t.shape[1] != shape[1])
    fail("{}: {}, expected {}[{}, {}] ({})", t.name, described(t), dtype_name(dtype), shape[0],
         shape[1], what);
  if (t.nbytes != static_cast<uint64_t>(shape[0] * shape[1]) * dtype_size(dtype))
    fail("{}: {} bytes for {}, expected {}", t.name, t.nbytes, described(t),
         shape[0] * shape[1] * static_cast<int64_t>(dtype_size(dtype)));
}

constexpr int64_t kMaxDim = int64_t{1} << 31;

}  // namespace

Matrix fp8_block_matrix(const TensorInfo& weight, const TensorInfo& scale_inv,
                        std::array<int64_t, 2> block) {
  if (block[0] != kFp8Block || block[1] != kFp8Block)
    fail("{}: weight_block_size [{}, {}] is not supported (the FP8 kernels take [128, 128])",
         weight.name, block[0], block[1]);
  if (weight.dtype != DType::kF8E4M3 || weight.shape.size() != 2 || weight.shape[0] <= 0 ||
      weight.shape[1] <= 0 || weight.shape[0] >= kMaxDim || weight.shape[1] >= kMaxDim)
    fail("{}: {}, expected F8_E4M3 of two positive dimensions below 2^31", weight.name,
         described(weight));
  const int64_t R = weight.shape[0], C = weight.shape[1];
  expect(weight, DType::kF8E4M3, {R, C}, "the FP8 codes");
  expect(scale_inv, DType::kF32, {ceil_div(R, kFp8Block), ceil_div(C, kFp8Block)},
         "one F32 scale per 128x128 block of the weight");
  return Matrix{.format = WeightFormat::kFP8,
                .rows = R,
                .cols = C,
                .data = weight.data,
                .scales = scale_inv.data};
}

std::array<int64_t, 2> int4_weight_shape(const TensorInfo& shape) {
  if ((shape.dtype != DType::kI64 && shape.dtype != DType::kI32) || shape.shape.size() != 1 ||
      shape.shape[0] != 2 || shape.nbytes != 2 * dtype_size(shape.dtype))
    fail("{}: {}, expected I64[2] or I32[2] (the packed weight's [rows, columns])", shape.name,
         described(shape));
  if (shape.data == nullptr)
    fail("{}: its bytes are not mapped (the shape is read from them)", shape.name);
  std::array<int64_t, 2> v{};
  for (int i = 0; i < 2; ++i) {
    if (shape.dtype == DType::kI64) {
      std::memcpy(&v[i], shape.data + 8 * i, 8);
    } else {
      int32_t w;
      std::memcpy(&w, shape.data + 4 * i, 4);
      v[i] = w;
    }
  }
  if (v[0] <= 0 || v[1] <= 0 || v[0] >= kMaxDim || v[1] >= kMaxDim)
    fail("{}: [{}, {}], expected two positive dimensions below 2^31", shape.name, v[0], v[1]);
  return v;
}

Matrix int4_packed_matrix(const TensorInfo& packed, const TensorInfo& scale,
                          std::array<int64_t, 2> shape, int64_t group) {
  if (group != kInt4Group)
    fail("{}: group_size {} is not supported (the INT4 kernels take groups of 32)", packed.name,
         group);
  const int64_t R = shape[0], C = shape[1];
  if (R <= 0 || C <= 0 || R >= kMaxDim || C >= kMaxDim)
    fail("{}: logical shape [{}, {}], expected two positive dimensions below 2^31", packed.name, R,
         C);
  expect(packed, DType::kI32, {R, ceil_div(C, 8)}, "eight 4-bit columns per int32 word");
  expect(scale, DType::kBF16, {R, ceil_div(C, kInt4Group)},
         "one BF16 scale per 32 columns of a row");
  return Matrix{.format = WeightFormat::kInt4,
                .rows = R,
                .cols = C,
                .data = packed.data,
                .scales = scale.data};
}

void check_quantized_values(const Matrix& w, const std::string& name) {
  if (w.format != WeightFormat::kFP8 && w.format != WeightFormat::kInt4) return;
  if (!w.valid() || w.scales == nullptr) fail("{}: no bytes to check", name);
  const auto* data = static_cast<const uint8_t*>(w.data);
  if (w.format == WeightFormat::kFP8) {
    for (int64_t r = 0; r < w.rows; ++r) {
      const uint8_t* row = data + r * w.row_bytes();
      for (int64_t c = 0; c < w.cols; ++c) {
        if ((row[c] & 0x7F) == 0x7F)
          fail("{}: row {}, column {} holds the FP8 NaN code 0x{:02X} (a weight must be finite)",
               name, r, c, row[c]);
      }
    }
  }
  const int64_t per_row =
      w.format == WeightFormat::kFP8 ? w.scale_row_bytes() / 4 : w.scale_row_bytes() / 2;
  for (int64_t i = 0; i < w.scale_rows(); ++i) {
    const uint8_t* s = w.scales + i * w.scale_row_bytes();
    for (int64_t j = 0; j < per_row; ++j) {
      float v;
      if (w.format == WeightFormat::kFP8) {
        std::memcpy(&v, s + 4 * j, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, s + 2 * j, 2);
        v = bf16_to_f32(h);
      }
      if (!std::isfinite(v))
        fail("{}: scale [{}, {}] is {} (scales must be finite)", name, i, j, v);
    }
  }
}

}  // namespace deltafin
