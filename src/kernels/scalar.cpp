// The reference kernels: straightforward loops in a fixed summation order (k ascending). Every
// SIMD table is tested against these. They decode each weight exactly (matrix.h).
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/kernels.h"
#include "tensor/dtype.h"

namespace deltafin::kernels {
namespace {

// Decodes row n of W into out[0..cols).
void decode_row(const Matrix& w, int64_t n, float* out) {
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + n * w.row_bytes();
  switch (w.format) {
    case WeightFormat::kF32:
      std::memcpy(out, row, static_cast<size_t>(w.cols) * 4);
      break;
    case WeightFormat::kBF16: {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(row);
      for (int64_t k = 0; k < w.cols; ++k) out[k] = bf16_to_f32(h[k]);
      break;
    }
    case WeightFormat::kMXFP4: {
      const uint8_t* sc = w.scale_row(n);
      for (int64_t k = 0; k < w.cols; k += 2) {
        uint8_t b = row[k / 2];
        float s = e8m0_to_float(sc[k / 32]);
        out[k] = kE2M1Values[b & 0xF] * s;
        out[k + 1] = kE2M1Values[b >> 4] * s;
      }
      break;
    }
    case WeightFormat::kInt8: {
      const int8_t* q = reinterpret_cast<const int8_t*>(row);
      uint16_t sbits;
      std::memcpy(&sbits, w.scales + n * 2, 2);
      float s = f16_to_f32(sbits);
      for (int64_t k = 0; k < w.cols; ++k) out[k] = static_cast<float>(q[k]) * s;
      break;
    }
    case WeightFormat::kFP8: {
      // The exact code times the block's F32 scale, rounded once (docs/FAMILY.md).
      const uint8_t* sc = w.scale_row(n);
      for (int64_t k = 0; k < w.cols; ++k) {
        float s;
        std::memcpy(&s, sc + k / kFp8Block * 4, 4);
        out[k] = e4m3_to_float(row[k]) * s;
      }
      break;
    }
    case WeightFormat::kInt4: {
      // (nibble - 8) times the group's BF16 scale: exact in float32.
      const uint8_t* sc = w.scale_row(n);
      for (int64_t k = 0; k < w.cols; ++k) {
        uint16_t s;
        std::memcpy(&s, sc + k / kInt4Group * 2, 2);
        const int q = static_cast<int>((row[k / 2] >> (k % 2 * 4)) & 0xF) - 8;
        out[k] = static_cast<float>(q) * bf16_to_f32(s);
      }
      break;
    }
  }
}

void matmul_scalar(const Matrix& w, int64_t n0, int64_t n1, const float* x, int64_t M, int64_t ldx,
                   float* y, int64_t ldy, bool accumulate) {
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(w.cols));
  for (int64_t n = n0; n < n1; ++n) {
    decode_row(w, n, row.data());
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * ldx;
      float acc = 0.0f;
      for (int64_t k = 0; k < w.cols; ++k) acc += xm[k] * row[k];
      float& out = y[m * ldy + n];
      out = accumulate ? out + acc : acc;
    }
  }
}

void matmul_t_scalar(const Matrix& w, int64_t c0, int64_t c1, const float* x, int64_t M,
                     int64_t ldx, float* y, int64_t ldy) {
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    decode_row(w, r, row.data());
    for (int64_t m = 0; m < M; ++m) {
      float a = x[m * ldx + r];
      float* ym = y + m * ldy;
      for (int64_t c = c0; c < c1; ++c) ym[c] += a * row[c];
    }
  }
}

float dot_scalar(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

void axpy_scalar(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void exp_scalar(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

void tanh_scalar(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}

// Eight independent chains the compiler may vectorise or not: the scalar table's own peak.
float fma_loop_scalar(int64_t iters) {
  float acc[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int64_t i = 0; i < iters; ++i) {
    for (float& a : acc) a = std::fma(a, 0.9999999f, 1e-7f);
  }
  float s = 0;
  for (float a : acc) s += a;
  return s;
}

}  // namespace

const KernelTable& scalar_table() {
  static const KernelTable t = {
      "scalar",
      {matmul_scalar, matmul_scalar, matmul_scalar, matmul_scalar, matmul_scalar, matmul_scalar},
      {matmul_t_scalar, matmul_t_scalar, matmul_t_scalar, matmul_t_scalar, matmul_t_scalar,
       matmul_t_scalar},
      dot_scalar,
      axpy_scalar,
      exp_scalar,
      tanh_scalar,
      fma_loop_scalar,
      16,
  };
  return t;
}

}  // namespace deltafin::kernels
