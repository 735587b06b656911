// One check shared by the FP8 / INT4 kernel tests (kernels_quant_test.cpp, which the NEON build
// under qemu runs too, and quant_test.cpp, against the float64 reference's files): a kernel
// table decodes a quantised matrix to exactly the expected float32 weights. With x the identity,
// y = x·Wᵀ is W itself, bit for bit, whatever the summation order (every other term is an exact
// zero), so one product per chunk of rows checks every weight through the table's real decoding
// paths: chunks of 1, 2, 3, 4 rows (the GEMV), 5 and 16 (the panel GEMM), and matmul_t (y += x·W,
// which with x the identity adds W to zeros). The weights must be finite (0 x NaN would spread).
#pragma once

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "tensor/matrix.h"

namespace deltafin::test {

// "" when table `t` decodes `w` to `want` ([rows][cols], finite) exactly, else the first
// difference. +0 and -0 count as equal (an exact zero added to -0 gives +0).
inline std::string decode_mismatch(const kernels::KernelTable& t, const Matrix& w,
                                   const std::vector<float>& want) {
  const int64_t R = w.rows, C = w.cols;
  auto describe = [&](const char* path, int64_t M, int64_t r, int64_t c, float got) {
    return std::string(t.name) + " " + weight_format_name(w.format) + " " + path +
           " M=" + std::to_string(M) + ": W[" + std::to_string(r) + "," + std::to_string(c) +
           "] = " + std::to_string(got) + ", expected " +
           std::to_string(want[static_cast<size_t>(r * C + c)]);
  };
  const int64_t chunks[] = {1, 2, 3, 4, 5, 16};
  // matmul: x rows = identity rows k0 .. k0 + M (as columns of W), y[m][r] = W[r][k0 + m].
  int64_t k0 = 0;
  for (int i = 0; k0 < C; ++i) {
    const int64_t M = std::min<int64_t>(chunks[i % 6], C - k0);
    std::vector<float> x(static_cast<size_t>(M * C), 0.0f), y(static_cast<size_t>(M * R), NAN);
    for (int64_t m = 0; m < M; ++m) x[static_cast<size_t>(m * C + k0 + m)] = 1.0f;
    t.matmul[static_cast<int>(w.format)](w, 0, R, x.data(), M, C, y.data(), R, false);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t r = 0; r < R; ++r) {
        const float got = y[static_cast<size_t>(m * R + r)];
        if (!(got == want[static_cast<size_t>(r * C + k0 + m)]))
          return describe("matmul", M, r, k0 + m, got);
      }
    }
    k0 += M;
  }
  // matmul_t: x rows = identity rows r0 .. r0 + M (as rows of W), y[m][c] = W[r0 + m][c].
  int64_t r0 = 0;
  for (int i = 0; r0 < R; ++i) {
    const int64_t M = std::min<int64_t>(chunks[i % 6], R - r0);
    std::vector<float> x(static_cast<size_t>(M * R), 0.0f), y(static_cast<size_t>(M * C), 0.0f);
    for (int64_t m = 0; m < M; ++m) x[static_cast<size_t>(m * R + r0 + m)] = 1.0f;
    t.matmul_t[static_cast<int>(w.format)](w, 0, C, x.data(), M, R, y.data(), C);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t c = 0; c < C; ++c) {
        const float got = y[static_cast<size_t>(m * C + c)];
        if (!(got == want[static_cast<size_t>((r0 + m) * C + c)]))
          return describe("matmul_t", M, r0 + m, c, got);
      }
    }
    r0 += M;
  }
  return "";
}

// The reference decoding of every weight (tensor/matrix.h: matrix_element).
inline std::vector<float> decoded(const Matrix& w) {
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c)
      out[static_cast<size_t>(r * w.cols + c)] = matrix_element(w, r, c);
  return out;
}

}  // namespace deltafin::test
