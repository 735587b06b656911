// The FP8 (E4M3, 128x128 F32 block scales) and INT4 (pack-quantized, BF16 group scales) weights
// decoded exactly by every kernel table (scalar, avx2, avx512, neon: each where the CPU has it),
// code by code: every finite E4M3 code in every lane position, in full and ragged blocks on both
// axes, under scales that round (non-powers of two), reach the float32 subnormals, come near the
// float32 maximum or are negative; the NaN codes give NaN; every nibble q = -8..7 in every
// position of its word, with subnormal, huge, negative, zero and non-finite BF16 scales, widths
// that leave padding nibbles; row slices that start inside a 128-row block. Expected values are
// the reference decoding of tensor/matrix.h, which quant_test.cpp holds to the float64
// reference's files. No Python, no storage layer: tools/test-neon.sh runs this file under qemu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "quant_check.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace deltafin {
namespace {

using kernels::KernelTable;

std::vector<const KernelTable*> tables() {
  std::vector<const KernelTable*> out = {&kernels::scalar_table()};
  for (const KernelTable* t :
       {kernels::avx2_table(), kernels::avx512_table(), kernels::neon_table()})
    if (t != nullptr) out.push_back(t);
  return out;
}

// An FP8 matrix [R, C]: code(r, c) from `code`, block scales from `scale(i, j)`.
struct Fp8 {
  std::vector<uint8_t> codes, scales;
  Matrix m;
  template <class Code, class Scale>
  Fp8(int64_t R, int64_t C, Code code, Scale scale) {
    m.format = WeightFormat::kFP8;
    m.rows = R;
    m.cols = C;
    codes.resize(static_cast<size_t>(R * C));
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) codes[static_cast<size_t>(r * C + c)] = code(r, c);
    scales.resize(static_cast<size_t>(m.scale_bytes()));
    const int64_t bc = m.scale_row_bytes() / 4;
    for (int64_t i = 0; i < m.scale_rows(); ++i) {
      for (int64_t j = 0; j < bc; ++j) {
        const float s = scale(i, j);
        std::memcpy(scales.data() + (i * bc + j) * 4, &s, 4);
      }
    }
    m.data = codes.data();
    m.scales = scales.data();
  }
};

// An INT4 matrix [R, C]: q(r, c) in -8..7, group scales (BF16 bits) from `scale(r, g)`.
struct Int4 {
  std::vector<uint8_t> words, scales;
  Matrix m;
  template <class Q, class Scale>
  Int4(int64_t R, int64_t C, Q q, Scale scale) {
    m.format = WeightFormat::kInt4;
    m.rows = R;
    m.cols = C;
    words.assign(static_cast<size_t>(R * m.row_bytes()), 0);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = 0; c < C; ++c) {
        const auto nib = static_cast<uint8_t>(q(r, c) + 8);
        words[static_cast<size_t>(r * m.row_bytes() + c / 2)] |=
            static_cast<uint8_t>(nib << (c % 2 * 4));
      }
    }
    const int64_t groups = m.scale_row_bytes() / 2;
    scales.resize(static_cast<size_t>(R * groups * 2));
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const uint16_t s = scale(r, g);
        std::memcpy(scales.data() + (r * groups + g) * 2, &s, 2);
      }
    }
    m.data = words.data();
    m.scales = scales.data();
  }
};

// Scales for a 2 x 3 block grid: 1, a power of two, one that makes products round, a float32
// subnormal, one near the maximum (448 x it is finite), a negative one.
float fp8_scale(int64_t i, int64_t j) {
  const float s[2][3] = {{1.0f, 0.0078125f, 0.31830987f}, {3e-40f, 7.5e35f, -1.3f}};
  return s[i % 2][j % 3];
}

TEST(KernelsQuant, E4M3DecodingFollowsTheFormat) {
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    const float v = e4m3_to_float(static_cast<uint8_t>(c));
    EXPECT_TRUE(std::isfinite(v)) << c;
    EXPECT_EQ(e4m3_to_float(static_cast<uint8_t>(c ^ 0x80)), -v) << c;  // the sign bit
  }
}

TEST(KernelsQuant, Fp8EveryFiniteCodeExactInEveryTable) {
  // 131 x 300: two row blocks (the second 3 rows) and three column blocks (the third 44
  // columns); each row runs through all 256 codes (step 3 mod 256), NaN codes replaced.
  Fp8 w(
      131, 300,
      [](int64_t r, int64_t c) {
        auto v = static_cast<uint8_t>((r * 7 + c * 3) % 256);
        return (v & 0x7F) == 0x7F ? static_cast<uint8_t>(v ^ 1) : v;
      },
      fp8_scale);
  const std::vector<float> want = test::decoded(w.m);
  // spot checks of the reference decoding itself: block (1, 1) scale, a ragged block
  EXPECT_EQ(matrix_element(w.m, 130, 200), e4m3_to_float(w.codes[130 * 300 + 200]) * 7.5e35f);
  EXPECT_EQ(matrix_element(w.m, 2, 299), e4m3_to_float(w.codes[2 * 300 + 299]) * 0.31830987f);
  for (const KernelTable* t : tables()) {
    EXPECT_EQ(test::decode_mismatch(*t, w.m, want), "");
    // a slice that starts inside a row block: rows 100..130 (phase 100, crossing into block 1)
    const Matrix s = w.m.row_slice(100, 131);
    EXPECT_EQ(s.row_phase, 100);
    const std::vector<float> tail(want.begin() + 100 * 300, want.end());
    EXPECT_EQ(test::decoded(s), tail);
    EXPECT_EQ(test::decode_mismatch(*t, s, tail), "");
    // and a slice of a slice
    const Matrix s2 = s.row_slice(30, 31);
    EXPECT_EQ(s2.row_phase, 2);
    EXPECT_EQ(test::decode_mismatch(*t, s2, std::vector<float>(want.end() - 300, want.end())), "");
  }
}

// A NaN code (only there, everything else code 0) makes its row's product NaN and no other, in
// the GEMV (M = 1), the panel GEMM (M = 6) and matmul_t, at every lane of a vector and in the
// ragged block.
TEST(KernelsQuant, Fp8NanCodesGiveNan) {
  for (const KernelTable* t : tables()) {
    for (uint8_t code : {uint8_t{0x7F}, uint8_t{0xFF}}) {
      for (int64_t col : {0, 1, 7, 15, 130, 255, 256, 299}) {
        Fp8 w(
            3, 300, [&](int64_t r, int64_t c) { return r == 1 && c == col ? code : uint8_t{0}; },
            fp8_scale);
        for (int64_t M : {1, 6}) {
          std::vector<float> x(static_cast<size_t>(M * 300), 0.0f), y(static_cast<size_t>(M * 3));
          for (int64_t m = 0; m < M; ++m) x[static_cast<size_t>(m * 300 + col)] = 1.0f;
          t->matmul[static_cast<int>(WeightFormat::kFP8)](w.m, 0, 3, x.data(), M, 300, y.data(), 3,
                                                          false);
          for (int64_t m = 0; m < M; ++m) {
            EXPECT_EQ(y[static_cast<size_t>(m * 3)], 0.0f) << t->name << " col " << col;
            EXPECT_TRUE(std::isnan(y[static_cast<size_t>(m * 3 + 1)])) << t->name << " col " << col;
            EXPECT_EQ(y[static_cast<size_t>(m * 3 + 2)], 0.0f) << t->name << " col " << col;
          }
        }
        std::vector<float> x = {0.0f, 1.0f, 0.0f}, y(300, 0.0f);
        t->matmul_t[static_cast<int>(WeightFormat::kFP8)](w.m, 0, 300, x.data(), 1, 3, y.data(),
                                                          300);
        for (int64_t c = 0; c < 300; ++c) {
          if (c == col) {
            EXPECT_TRUE(std::isnan(y[static_cast<size_t>(c)])) << t->name << " matmul_t";
          } else {
            EXPECT_EQ(y[static_cast<size_t>(c)], 0.0f) << t->name << " matmul_t col " << c;
          }
        }
      }
    }
  }
}

// BF16 group scales: ordinary ones, then per row a subnormal, 2^123 (8 x it is finite), a
// negative one, +0 and -0.
uint16_t int4_scale(int64_t r, int64_t g) {
  const uint16_t special[] = {0x0001, 0x7D00, 0xBF80, 0x0000, 0x8000, 0x3F80, 0x3C4D};
  if ((r + g) % 3 == 0) return special[(r + g) % 7];
  return f32_to_bf16(0.001f * static_cast<float>(1 + (r * 5 + g * 11) % 97));
}

TEST(KernelsQuant, Int4EveryNibbleExactInEveryTable) {
  for (int64_t C : {int64_t{300}, int64_t{100}, int64_t{37}}) {  // 300: full words; else padding
    // q runs through -8..7 along each row (shifted per row, so every nibble meets every position
    // of its word and of a vector)
    Int4 w(
        37, C, [](int64_t r, int64_t c) { return static_cast<int>((r + c * 5) % 16) - 8; },
        int4_scale);
    const std::vector<float> want = test::decoded(w.m);
    for (const KernelTable* t : tables()) {
      EXPECT_EQ(test::decode_mismatch(*t, w.m, want), "") << "C=" << C;
      const Matrix s = w.m.row_slice(5, 37);
      EXPECT_EQ(test::decode_mismatch(*t, s, std::vector<float>(want.begin() + 5 * C, want.end())),
                "");
    }
  }
  // the layout itself: column 8j + i in bits 4i..4i+3 of word j, stored as q + 8
  const uint32_t word = 0x76543210u;  // q = -8 .. -1 in columns 0..7
  const uint16_t one = 0x3F80;
  Matrix m;
  m.format = WeightFormat::kInt4;
  m.rows = 1;
  m.cols = 8;
  m.data = &word;
  m.scales = reinterpret_cast<const uint8_t*>(&one);
  for (int c = 0; c < 8; ++c) EXPECT_EQ(matrix_element(m, 0, c), static_cast<float>(c - 8));
}

// Non-finite BF16 scales give what the reference decoding gives: q * NaN is NaN, q * inf is
// +-inf and 0 * inf NaN, so a product over such a group is NaN or +-inf whatever the order of
// the sum; every table must agree with the scalar one on which (GEMV, panel GEMM, matmul_t).
TEST(KernelsQuant, Int4NonFiniteScalesAsTheReference) {
  std::mt19937 rng(36);
  std::uniform_int_distribution<int> nib(-8, 7);
  std::uniform_real_distribution<float> u(0.5f, 1.0f);
  for (uint16_t bits : {uint16_t{0x7FC0}, uint16_t{0x7F80}, uint16_t{0xFF80}}) {
    for (int trial = 0; trial < 8; ++trial) {
      // trial 0: no zero and one sign in group 1 of row 1 (+-inf); later trials random q
      Int4 w(
          3, 96, [&](int64_t, int64_t c) { return trial == 0 && c >= 32 && c < 64 ? 3 : nib(rng); },
          [&](int64_t r, int64_t g) { return r == 1 && g == 1 ? bits : uint16_t{0x3C00}; });
      for (int64_t M : {1, 6}) {
        std::vector<float> x(static_cast<size_t>(M * 96));
        for (auto& v : x) v = u(rng);
        std::vector<float> ref(static_cast<size_t>(M * 3)), y(ref.size());
        kernels::scalar_table().matmul[static_cast<int>(WeightFormat::kInt4)](
            w.m, 0, 3, x.data(), M, 96, ref.data(), 3, false);
        if (trial == 0) {
          EXPECT_EQ(std::isinf(ref[1]), bits != 0x7FC0);
        }
        for (const KernelTable* t : tables()) {
          t->matmul[static_cast<int>(WeightFormat::kInt4)](w.m, 0, 3, x.data(), M, 96, y.data(), 3,
                                                           false);
          for (int64_t m = 0; m < M; ++m) {
            const float a = y[static_cast<size_t>(m * 3 + 1)],
                        b = ref[static_cast<size_t>(m * 3 + 1)];
            EXPECT_TRUE(std::isnan(a) ? std::isnan(b) : a == b)
                << t->name << " scale 0x" << std::hex << bits << std::dec << " M=" << M << ": " << a
                << " vs " << b;
            EXPECT_TRUE(std::isfinite(y[static_cast<size_t>(m * 3)])) << t->name;
          }
        }
        // matmul_t: x one row per W row, y over all columns
        std::vector<float> xt(3), yt(96, 0.0f), rt(96, 0.0f);
        for (auto& v : xt) v = u(rng);
        kernels::scalar_table().matmul_t[static_cast<int>(WeightFormat::kInt4)](
            w.m, 0, 96, xt.data(), 1, 3, rt.data(), 96);
        for (const KernelTable* t : tables()) {
          std::fill(yt.begin(), yt.end(), 0.0f);
          t->matmul_t[static_cast<int>(WeightFormat::kInt4)](w.m, 0, 96, xt.data(), 1, 3, yt.data(),
                                                             96);
          for (int c = 0; c < 96; ++c) {
            double bound = 0;  // finite columns: within 1e-5 of the summed magnitudes
            for (int r = 0; r < 3; ++r) bound += std::fabs(xt[r] * matrix_element(w.m, r, c));
            const bool ok = std::isnan(rt[c])   ? std::isnan(yt[c])
                            : std::isinf(rt[c]) ? yt[c] == rt[c]
                                                : std::fabs(yt[c] - rt[c]) <= 1e-5 * bound;
            EXPECT_TRUE(ok) << t->name << " matmul_t c=" << c << ": " << yt[c] << " vs " << rt[c];
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace deltafin
