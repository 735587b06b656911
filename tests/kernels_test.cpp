// Kernel tests: every SIMD table (avx2, avx512, neon — each skipped where this CPU lacks it)
// against the scalar reference on odd sizes, every weight format (FP8 and INT4 included; their
// exact decoding is checked code by code in kernels_quant_test.cpp), accumulate on and off, output
// sub-ranges, strided x and y; exact MXFP4 decoding (E8M0 edge bytes, every nibble code, nibble
// order) checked bit for bit; and the reproducibility promises of simd_impl.h checked bit for bit:
// the n0/n1 split, the thread count of the front end, and the batch size M do not change any
// output element. Runs standalone too: `deltafin_tests --gtest_filter='Kernels*'`.
#include "kernels/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/thread_pool.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace deltafin {
namespace {

using kernels::KernelTable;

const KernelTable* table_by_name(const std::string& name) {
  if (name == "scalar") return &kernels::scalar_table();
  if (name == "avx2") return kernels::avx2_table();
  if (name == "avx512") return kernels::avx512_table();
  if (name == "neon") return kernels::neon_table();
  return nullptr;
}

#define REQUIRE_TABLE(t, name)                \
  const KernelTable* t = table_by_name(name); \
  if (t == nullptr) GTEST_SKIP() << "kernel table '" << (name) << "' is not available on this CPU"

// Owns the bytes behind a Matrix view.
struct TestMatrix {
  WeightFormat format;
  int64_t rows, cols;
  std::vector<uint8_t> data, scales;
  Matrix view() const {
    Matrix m;
    m.format = format;
    m.rows = rows;
    m.cols = cols;
    m.data = data.data();
    m.scales = scales.empty() ? nullptr : scales.data();
    return m;
  }
  // Exact decoded copy (reference decoding of matrix.h).
  std::vector<float> decoded() const {
    Matrix m = view();
    std::vector<float> out(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = matrix_element(m, r, c);
    return out;
  }
};

TestMatrix make_matrix(WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng) {
  TestMatrix t{f, rows, cols, {}, {}};
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Matrix v = t.view();
  t.data.resize(static_cast<size_t>(rows * v.row_bytes()));
  switch (f) {
    case WeightFormat::kF32:
      for (int64_t i = 0; i < rows * cols; ++i) {
        float x = u(rng);
        std::memcpy(t.data.data() + i * 4, &x, 4);
      }
      break;
    case WeightFormat::kBF16:
      for (int64_t i = 0; i < rows * cols; ++i) {
        uint16_t h = f32_to_bf16(u(rng));
        std::memcpy(t.data.data() + i * 2, &h, 2);
      }
      break;
    case WeightFormat::kMXFP4: {
      for (auto& b : t.data) b = static_cast<uint8_t>(rng());
      t.scales.resize(static_cast<size_t>(rows * v.scale_row_bytes()));
      std::uniform_int_distribution<int> e(118, 130);
      for (auto& s : t.scales) s = static_cast<uint8_t>(e(rng));
      break;
    }
    case WeightFormat::kInt8: {
      for (auto& b : t.data) b = static_cast<uint8_t>(rng());
      t.scales.resize(static_cast<size_t>(rows * 2));
      for (int64_t r = 0; r < rows; ++r) {
        uint16_t s = f32_to_f16(0.001f + 0.01f * (u(rng) + 1.0f));
        std::memcpy(t.scales.data() + r * 2, &s, 2);
      }
      break;
    }
    case WeightFormat::kFP8: {  // every finite code (NaN codes: KernelsQuant), F32 block scales
      for (auto& b : t.data) {
        b = static_cast<uint8_t>(rng());
        if ((b & 0x7F) == 0x7F) b ^= 1;
      }
      t.scales.resize(static_cast<size_t>(v.scale_bytes()));
      for (size_t i = 0; i < t.scales.size(); i += 4) {
        const float s = (0.5f + 0.25f * (u(rng) + 1.0f)) / 448;
        std::memcpy(t.scales.data() + i, &s, 4);
      }
      break;
    }
    case WeightFormat::kInt4: {  // every nibble, BF16 group scales
      for (auto& b : t.data) b = static_cast<uint8_t>(rng());
      t.scales.resize(static_cast<size_t>(v.scale_bytes()));
      for (size_t i = 0; i < t.scales.size(); i += 2) {
        const uint16_t s = f32_to_bf16((0.5f + 0.25f * (u(rng) + 1.0f)) / 7.5f);
        std::memcpy(t.scales.data() + i, &s, 2);
      }
      break;
    }
  }
  return t;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

const char* fmt_name(WeightFormat f) {
  return weight_format_name(f);
}

constexpr WeightFormat kFormats[] = {WeightFormat::kF32,  WeightFormat::kBF16, WeightFormat::kMXFP4,
                                     WeightFormat::kInt8, WeightFormat::kFP8,  WeightFormat::kInt4};

std::vector<int64_t> test_ks(WeightFormat f) {
  if (f == WeightFormat::kMXFP4) return {32, 64, 96, 160, 4128, 7168};
  return {1, 7, 15, 33, 257, 1000, 32, 64, 96, 160, 4128, 7168};
}

// Runs table t and the scalar reference on the same inputs and compares: inside [n0, n1) within
// 1e-5 of sum |x w| (+ |y0| when accumulating); everything else in y must be untouched.
// Returns "" or a description of the first mismatch.
std::string check_matmul(const KernelTable& t, const TestMatrix& tw, const std::vector<float>& wd,
                         int64_t M, int64_t n0, int64_t n1, bool accumulate, int64_t xpad,
                         int64_t ypad, std::mt19937& rng) {
  const Matrix w = tw.view();
  const int64_t K = w.cols, N = w.rows;
  const int64_t ldx = K + xpad, ldy = N + ypad;
  std::vector<float> x = random_floats(static_cast<size_t>(M * ldx + 1), rng);
  std::vector<float> y0 = random_floats(static_cast<size_t>(M * ldy), rng);
  if (!accumulate) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = n0; n < n1; ++n) y0[m * ldy + n] = NAN;  // must be overwritten
  }
  std::vector<float> y = y0, yr = y0;
  const float* xp = x.data() + 1;  // deliberately not vector-aligned
  t.matmul[static_cast<int>(w.format)](w, n0, n1, xp, M, ldx, y.data(), ldy, accumulate);
  kernels::scalar_table().matmul[static_cast<int>(w.format)](w, n0, n1, xp, M, ldx, yr.data(), ldy,
                                                             accumulate);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < ldy; ++n) {
      const int64_t i = m * ldy + n;
      if (n < n0 || n >= n1) {
        if (!same_bits(y[i], y0[i]))
          return "y[" + std::to_string(m) + "," + std::to_string(n) +
                 "] outside the range was written";
        continue;
      }
      double bound = accumulate ? std::fabs(static_cast<double>(y0[i])) : 0.0;
      for (int64_t k = 0; k < K; ++k)
        bound += std::fabs(static_cast<double>(xp[m * ldx + k]) * wd[n * K + k]);
      const double tol = 1e-5 * bound + 1e-30;
      if (!(std::fabs(static_cast<double>(y[i]) - yr[i]) <= tol)) {
        return std::string(t.name) + " " + fmt_name(w.format) + " M=" + std::to_string(M) +
               " N=" + std::to_string(N) + " K=" + std::to_string(K) + " n0=" + std::to_string(n0) +
               " n1=" + std::to_string(n1) + " acc=" + std::to_string(accumulate) + ": y[" +
               std::to_string(m) + "," + std::to_string(n) + "] = " + std::to_string(y[i]) +
               " vs scalar " + std::to_string(yr[i]) + " (tol " + std::to_string(tol) + ")";
      }
    }
  }
  return "";
}

// ---- parameterised over (table, format) ------------------------------------------------------

class Matmul : public ::testing::TestWithParam<std::tuple<std::string, WeightFormat>> {};

TEST_P(Matmul, OddSizesMatchScalar) {
  auto [name, f] = GetParam();
  REQUIRE_TABLE(t, name);
  std::mt19937 rng(1234);
  int cases = 0;
  for (int64_t K : test_ks(f)) {
    for (int64_t N : {1, 3, 17, 100}) {
      TestMatrix w = make_matrix(f, N, K, rng);
      std::vector<float> wd = w.decoded();
      for (int64_t M : {1, 2, 3, 4, 5, 7, 13, 64}) {
        for (bool acc : {false, true}) {
          std::string err = check_matmul(*t, w, wd, M, 0, N, acc, 0, 0, rng);
          ASSERT_EQ(err, "");
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 0);
}

TEST_P(Matmul, SubRangesAndStrides) {
  auto [name, f] = GetParam();
  REQUIRE_TABLE(t, name);
  std::mt19937 rng(99);
  const std::vector<int64_t> ks = f == WeightFormat::kMXFP4 ? std::vector<int64_t>{32, 160, 288}
                                                            : std::vector<int64_t>{7, 33, 257, 300};
  for (int64_t K : ks) {
    TestMatrix w = make_matrix(f, 100, K, rng);
    std::vector<float> wd = w.decoded();
    for (int64_t M : {1, 2, 3, 4, 5, 7, 13, 64}) {
      for (auto [n0, n1] : {std::pair<int64_t, int64_t>{16, 83},
                            {32, 48},
                            {3, 50},
                            {96, 100},
                            {0, 1},
                            {5, 6},
                            {17, 100}}) {
        for (bool acc : {false, true}) {
          ASSERT_EQ(check_matmul(*t, w, wd, M, n0, n1, acc, 5, 3, rng), "");
          ASSERT_EQ(check_matmul(*t, w, wd, M, n0, n1, acc, 64, 17, rng), "");
        }
      }
    }
  }
}

// y[m, n] must not depend on how [0, N) is split (on multiples of 16, as dispatch.cpp does) nor
// on M: row m of an M-row product equals the 1-row product of x row m, bit for bit.
TEST_P(Matmul, SplitAndBatchInvariant) {
  auto [name, f] = GetParam();
  REQUIRE_TABLE(t, name);
  std::mt19937 rng(7);
  const auto fn = t->matmul[static_cast<int>(f)];
  for (int64_t K : {int64_t{160}, int64_t{4128}}) {
    const int64_t N = 100;
    TestMatrix tw = make_matrix(f, N, K, rng);
    const Matrix w = tw.view();
    for (int64_t M : {1, 2, 3, 5, 13, 64}) {
      std::vector<float> x = random_floats(static_cast<size_t>(M * K), rng);
      std::vector<float> full(static_cast<size_t>(M * N)), split(full.size());
      fn(w, 0, N, x.data(), M, K, full.data(), N, false);
      for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 16}, {16, 48}, {48, 64}, {64, 100}}) {
        fn(w, b, e, x.data(), M, K, split.data(), N, false);
      }
      for (size_t i = 0; i < full.size(); ++i) {
        ASSERT_TRUE(same_bits(full[i], split[i]))
            << fmt_name(f) << " K=" << K << " M=" << M << " i=" << i;
      }
      for (int64_t m = 0; m < M; ++m) {
        std::vector<float> one(static_cast<size_t>(N));
        fn(w, 0, N, x.data() + m * K, 1, K, one.data(), N, false);
        for (int64_t n = 0; n < N; ++n) {
          ASSERT_TRUE(same_bits(one[n], full[m * N + n]))
              << fmt_name(f) << " K=" << K << " M=" << M << " m=" << m << " n=" << n << ": "
              << one[n] << " vs " << full[m * N + n];
        }
      }
    }
  }
}

// A batch taller than one packed block of x (the GEMM packs at most ~8 MiB of x at a time:
// 292 rows at K = 7168) is cut into row blocks; every row still gets the GEMV's bits.
TEST_P(Matmul, TallBatchMatchesRowByRow) {
  auto [name, f] = GetParam();
  REQUIRE_TABLE(t, name);
  std::mt19937 rng(11);
  const auto fn = t->matmul[static_cast<int>(f)];
  const int64_t K = 7168, N = 12, M = 300;
  TestMatrix tw = make_matrix(f, N, K, rng);
  const Matrix w = tw.view();
  std::vector<float> x = random_floats(static_cast<size_t>(M * K), rng);
  std::vector<float> full(static_cast<size_t>(M * N));
  fn(w, 0, N, x.data(), M, K, full.data(), N, false);
  std::vector<float> one(static_cast<size_t>(N));
  for (int64_t m = 0; m < M; ++m) {
    fn(w, 0, N, x.data() + m * K, 1, K, one.data(), N, false);
    for (int64_t n = 0; n < N; ++n) {
      ASSERT_TRUE(same_bits(one[n], full[m * N + n]))
          << fmt_name(f) << " m=" << m << " n=" << n << ": " << one[n] << " vs " << full[m * N + n];
    }
  }
}

// The threaded front end gives the same bits with 1, 2 or 3 threads as one single call.
TEST_P(Matmul, ThreadedFrontEndIsDeterministic) {
  auto [name, f] = GetParam();
  REQUIRE_TABLE(t, name);
  const std::string before = kernels::active().name;
  kernels::select(name.c_str());
  std::mt19937 rng(3);
  const int64_t N = 1000;
  for (int64_t K : {int64_t{160}, int64_t{1024}}) {
    TestMatrix tw = make_matrix(f, N, K, rng);
    const Matrix w = tw.view();
    for (int64_t M : {1, 5}) {
      std::vector<float> x = random_floats(static_cast<size_t>(M * K), rng);
      std::vector<float> ref(static_cast<size_t>(M * N));
      t->matmul[static_cast<int>(f)](w, 0, N, x.data(), M, K, ref.data(), N, false);
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        std::vector<float> y(ref.size(), NAN);
        kernels::matmul(w, x.data(), M, K, y.data(), N, pool, false);
        for (size_t i = 0; i < y.size(); ++i) {
          ASSERT_TRUE(same_bits(y[i], ref[i]))
              << threads << " threads, K=" << K << " M=" << M << " i=" << i;
        }
      }
    }
  }
  kernels::select(before.c_str());
}

TEST_P(Matmul, TransposedMatchesScalar) {
  auto [name, f] = GetParam();
  REQUIRE_TABLE(t, name);
  auto fn = t->matmul_t[static_cast<int>(f)];
  if (fn == nullptr) GTEST_SKIP() << "no matmul_t for this format";
  auto ref = kernels::scalar_table().matmul_t[static_cast<int>(f)];
  std::mt19937 rng(5);
  const std::vector<int64_t> cs = f == WeightFormat::kMXFP4
                                      ? std::vector<int64_t>{32, 96, 512}
                                      : std::vector<int64_t>{1, 3, 17, 100, 512};
  for (int64_t R : {1, 7, 33, 128, 300}) {
    for (int64_t C : cs) {
      TestMatrix tw = make_matrix(f, R, C, rng);
      const Matrix w = tw.view();
      std::vector<float> wd = tw.decoded();
      for (int64_t M : {1, 2, 5, 13, 64}) {
        for (auto [c0, c1] : {std::pair<int64_t, int64_t>{0, C},
                              {C > 17 ? 16 : 0, C > 17 ? C - 1 : C},
                              {C / 3, C / 2 + 1}}) {
          if (c0 >= c1) continue;
          const int64_t ldx = R + 3, ldy = C + 5;
          std::vector<float> x = random_floats(static_cast<size_t>(M * ldx), rng);
          std::vector<float> y0 = random_floats(static_cast<size_t>(M * ldy), rng);
          std::vector<float> y = y0, yr = y0;
          fn(w, c0, c1, x.data(), M, ldx, y.data(), ldy);
          ref(w, c0, c1, x.data(), M, ldx, yr.data(), ldy);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t c = 0; c < ldy; ++c) {
              const int64_t i = m * ldy + c;
              if (c < c0 || c >= c1) {
                ASSERT_TRUE(same_bits(y[i], y0[i]))
                    << "written outside the range at " << m << "," << c;
                continue;
              }
              double bound = std::fabs(y0[i]);
              for (int64_t r = 0; r < R; ++r)
                bound += std::fabs(static_cast<double>(x[m * ldx + r]) * wd[r * C + c]);
              ASSERT_NEAR(y[i], yr[i], 1e-5 * bound)
                  << fmt_name(f) << " R=" << R << " C=" << C << " M=" << M << " c0=" << c0
                  << " c1=" << c1 << " at " << m << "," << c;
            }
          }
        }
      }
    }
  }
}

// matmul_t: the column split and M (small-M row streaming vs the panel path) do not change y.
TEST_P(Matmul, TransposedSplitAndBatchInvariant) {
  auto [name, f] = GetParam();
  REQUIRE_TABLE(t, name);
  auto fn = t->matmul_t[static_cast<int>(f)];
  if (fn == nullptr) GTEST_SKIP() << "no matmul_t for this format";
  std::mt19937 rng(17);
  const int64_t R = 300, C = f == WeightFormat::kMXFP4 ? 576 : 600;
  TestMatrix tw = make_matrix(f, R, C, rng);
  const Matrix w = tw.view();
  for (int64_t M : {1, 3, 5, 13}) {
    std::vector<float> x = random_floats(static_cast<size_t>(M * R), rng);
    std::vector<float> y0 = random_floats(static_cast<size_t>(M * C), rng);
    std::vector<float> full = y0, split = y0;
    fn(w, 0, C, x.data(), M, R, full.data(), C);
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 16}, {16, 96}, {96, 560}, {560, C}}) {
      fn(w, b, e, x.data(), M, R, split.data(), C);
    }
    for (int64_t m = 0; m < M; ++m) {
      std::vector<float> one(y0.begin() + m * C, y0.begin() + (m + 1) * C);
      fn(w, 0, C, x.data() + m * R, 1, R, one.data(), C);
      for (int64_t c = 0; c < C; ++c) {
        ASSERT_TRUE(same_bits(full[m * C + c], split[m * C + c])) << "M=" << M << " c=" << c;
        ASSERT_TRUE(same_bits(full[m * C + c], one[c])) << "M=" << M << " m=" << m << " c=" << c;
      }
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<Matmul::ParamType>& info) {
  return std::get<0>(info.param) + "_" + fmt_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Kernels, Matmul,
                         ::testing::Combine(::testing::Values("avx2", "avx512", "neon"),
                                            ::testing::ValuesIn(kFormats)),
                         param_name);

// ---- vectors ---------------------------------------------------------------------------------

class Vec : public ::testing::TestWithParam<std::string> {};

TEST_P(Vec, DotAndAxpyMatchScalar) {
  REQUIRE_TABLE(t, GetParam());
  std::mt19937 rng(11);
  for (int64_t n : {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 129, 1000, 4099}) {
    std::vector<float> a = random_floats(static_cast<size_t>(n + 1), rng);
    std::vector<float> b = random_floats(static_cast<size_t>(n + 1), rng);
    double bound = 0;
    for (int64_t i = 0; i < n; ++i) bound += std::fabs(static_cast<double>(a[i + 1]) * b[i]);
    EXPECT_NEAR(t->dot(a.data() + 1, b.data(), n),
                kernels::scalar_table().dot(a.data() + 1, b.data(), n), 1e-5 * bound)
        << "n=" << n;
    std::vector<float> y = random_floats(static_cast<size_t>(n + 2), rng), yr = y;
    const float alpha = 0.75f;
    t->axpy(alpha, a.data() + 1, y.data() + 1, n);
    kernels::scalar_table().axpy(alpha, a.data() + 1, yr.data() + 1, n);
    EXPECT_TRUE(same_bits(y[0], yr[0]));
    EXPECT_TRUE(same_bits(y[n + 1], yr[n + 1])) << "axpy wrote past the end, n=" << n;
    for (int64_t i = 1; i <= n; ++i) {
      EXPECT_NEAR(y[i], yr[i], 1e-6 * (std::fabs(yr[i]) + std::fabs(alpha * a[i])))
          << "n=" << n << " i=" << i;
    }
  }
}

// Distance in representable floats (0: same value; +0 and -0 are one apart). Both finite.
int64_t ulp_distance(float a, float b) {
  auto key = [](float v) {
    int32_t i;
    std::memcpy(&i, &v, 4);
    return i < 0 ? -static_cast<int64_t>(i & 0x7fffffff) - 1 : static_cast<int64_t>(i);
  };
  return std::llabs(key(a) - key(b));
}

// Arguments for exp and tanh: a dense sweep over the ranges that matter, the edges of exp's
// range (overflow past 88.72, subnormal results below -87.3), tiny and huge magnitudes.
std::vector<float> unary_arguments() {
  std::vector<float> x;
  for (float v = -110.0f; v <= 95.0f; v += 0.0137f) x.push_back(v);
  for (float v = -4.0f; v <= 4.0f; v += 1.0f / 1024) x.push_back(v);
  for (int e = -149; e <= 127; e += 3) {
    x.push_back(std::ldexp(1.0f, e));
    x.push_back(-std::ldexp(1.3f, e));
  }
  for (float v : {0.0f, -0.0f, 88.72f, 88.73f, -87.33f, -103.9f, 1e-30f, -1e-30f}) x.push_back(v);
  return x;
}

TEST_P(Vec, ExpAndTanhAccurateWhereverTheValueSits) {
  REQUIRE_TABLE(t, GetParam());
  const std::vector<float> x = unary_arguments();
  const int64_t n = static_cast<int64_t>(x.size());
  // SLEEF (the x86 tables) is within 1 ULP; the scalar and NEON tables use libm, whose tanhf
  // glibc documents at up to 2 ULP (seen here: tanh(0.53125) two floats off).
  const int64_t bound = GetParam() == "scalar" || GetParam() == "neon" ? 2 : 1;
  for (int fn = 0; fn < 2; ++fn) {
    const kernels::UnaryFn f = fn == 0 ? t->exp : t->tanh;
    const char* name = fn == 0 ? "exp" : "tanh";
    std::vector<float> y(x.size() + 1, 7.0f);
    f(x.data(), y.data(), n);
    EXPECT_EQ(y[x.size()], 7.0f) << name << " wrote past the end";
    for (size_t i = 0; i < x.size(); ++i) {
      const double xd = x[i];
      const float ref = static_cast<float>(fn == 0 ? std::exp(xd) : std::tanh(xd));
      if (std::isinf(ref)) {
        EXPECT_EQ(y[i], ref) << name << "(" << x[i] << ")";
        continue;
      }
      EXPECT_LE(ulp_distance(y[i], ref), bound)
          << name << "(" << x[i] << ") = " << y[i] << ", not " << ref;
      // The same bits alone (n = 1, a tail of one lane) as at position i of a long call.
      float alone = 0;
      f(&x[i], &alone, 1);
      EXPECT_TRUE(same_bits(alone, y[i])) << name << "(" << x[i] << ") depends on its position";
    }
    // In place, as callers use it.
    std::vector<float> z = x;
    f(z.data(), z.data(), n);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(same_bits(z[i], y[i])) << name << " in place";
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float sx[6] = {inf, -inf, nan, 0.0f, -0.0f, 100.0f}, e[6], th[6];
  t->exp(sx, e, 6);
  t->tanh(sx, th, 6);
  EXPECT_EQ(e[0], inf);
  EXPECT_EQ(e[1], 0.0f);
  EXPECT_TRUE(std::isnan(e[2]));
  EXPECT_EQ(e[3], 1.0f);
  EXPECT_EQ(e[5], inf);
  EXPECT_EQ(th[0], 1.0f);
  EXPECT_EQ(th[1], -1.0f);
  EXPECT_TRUE(std::isnan(th[2]));
  EXPECT_TRUE(same_bits(th[4], -0.0f));
  EXPECT_EQ(th[5], 1.0f);
}

// SLEEF's "finz" functions promise the same bits on every FMA ISA: the AVX2 and AVX-512 tables
// must agree exactly, so a machine's choice of table never changes an activation.
TEST(KernelsVec, X86TablesAgreeOnExpAndTanh) {
  const KernelTable* a = kernels::avx2_table();
  const KernelTable* b = kernels::avx512_table();
  if (a == nullptr || b == nullptr) GTEST_SKIP() << "needs both AVX2 and AVX-512";
  const std::vector<float> x = unary_arguments();
  std::vector<float> ya(x.size()), yb(x.size());
  for (int fn = 0; fn < 2; ++fn) {
    (fn == 0 ? a->exp : a->tanh)(x.data(), ya.data(), static_cast<int64_t>(x.size()));
    (fn == 0 ? b->exp : b->tanh)(x.data(), yb.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_TRUE(same_bits(ya[i], yb[i])) << (fn == 0 ? "exp(" : "tanh(") << x[i] << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Vec, ::testing::Values("scalar", "avx2", "avx512", "neon"),
                         [](const auto& info) { return info.param; });

// ---- MXFP4 decoding --------------------------------------------------------------------------

TEST(KernelsMxfp4, E8M0ScaleBytes) {
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));  // 2^-127, a subnormal: not zero
  EXPECT_GT(e8m0_to_float(0), 0.0f);
  EXPECT_EQ(e8m0_to_float(1), std::ldexp(1.0f, -126));
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(128), 2.0f);
  EXPECT_EQ(e8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
}

TEST(KernelsMxfp4, ReferenceNibbleOrder) {
  // Row of 32 columns: byte i holds column 2i (low nibble) and 2i+1 (high nibble).
  std::vector<uint8_t> q(16, 0), s = {127};
  q[0] = 0x21;   // col 0: code 1 (0.5), col 1: code 2 (1.0)
  q[15] = 0xF9;  // col 30: code 9 (-0.5), col 31: code 15 (-6)
  Matrix m;
  m.format = WeightFormat::kMXFP4;
  m.rows = 1;
  m.cols = 32;
  m.data = q.data();
  m.scales = s.data();
  EXPECT_EQ(matrix_element(m, 0, 0), 0.5f);
  EXPECT_EQ(matrix_element(m, 0, 1), 1.0f);
  EXPECT_EQ(matrix_element(m, 0, 2), 0.0f);
  EXPECT_EQ(matrix_element(m, 0, 30), -0.5f);
  EXPECT_EQ(matrix_element(m, 0, 31), -6.0f);
  const float expect[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(kE2M1Values[c], expect[c]) << c;
}

// Every table decodes every code at every nibble position and every edge scale byte exactly: a
// one-hot x picks out a single weight, so y must be exactly E2M1[code] * 2^(e - 127) (NaN for
// e = 255), through the small-M path (M = 1), the panel path (M = 6) and matmul_t. Five groups,
// so that a table decoding four groups at a time meets both a full block and a partial one (their
// scales are built differently).
TEST(KernelsMxfp4, EveryCodeAndScaleExactInEveryTable) {
  const int64_t K = 160;
  const int64_t G = K / 32;
  for (const char* name : {"scalar", "avx2", "avx512", "neon"}) {
    const KernelTable* t = table_by_name(name);
    if (t == nullptr) continue;
    for (int e : {0, 1, 2, 126, 127, 128, 200, 254, 255}) {
      for (int code = 0; code < 16; ++code) {
        for (int64_t col : {int64_t{0}, int64_t{1}, int64_t{36}, int64_t{63}, int64_t{94},
                            int64_t{95}, int64_t{127}, int64_t{128}, int64_t{159}}) {
          // Rows: 0 holds the code at `col`; row 1 holds it at col ^ 1 (the other nibble).
          std::vector<uint8_t> q(2 * K / 2, 0), s(2 * K / 32, 127);
          auto put = [&](int64_t r, int64_t c) {
            uint8_t& b = q[r * K / 2 + c / 2];
            b = static_cast<uint8_t>(c % 2 == 0 ? (b & 0xF0) | code : (b & 0x0F) | (code << 4));
          };
          put(0, col);
          put(1, col ^ 1);
          s[0 * G + col / 32] = static_cast<uint8_t>(e);
          s[1 * G + col / 32] = static_cast<uint8_t>(e);
          Matrix w;
          w.format = WeightFormat::kMXFP4;
          w.rows = 2;
          w.cols = K;
          w.data = q.data();
          w.scales = s.data();
          const float want = e == 255 ? NAN : std::ldexp(kE2M1Values[code], e - 127);
          for (int64_t M : {1, 6}) {
            std::vector<float> x(static_cast<size_t>(M * K), 0.0f),
                y(static_cast<size_t>(M * 2), -1.0f);
            for (int64_t m = 0; m < M; ++m) x[m * K + col] = 1.0f;
            t->matmul[static_cast<int>(WeightFormat::kMXFP4)](w, 0, 2, x.data(), M, K, y.data(), 2,
                                                              false);
            for (int64_t m = 0; m < M; ++m) {
              const float got = y[m * 2 + 0];
              if (e == 255) {
                EXPECT_TRUE(std::isnan(got)) << name << " e=255 code=" << code;
              } else {
                EXPECT_EQ(got, want)
                    << name << " M=" << M << " e=" << e << " code=" << code << " col=" << col;
              }
              // Row 1 has the code on the other nibble of the same byte: x misses it.
              // (0 * inf would be NaN, in the reference too.)
              if (std::isfinite(want)) {
                EXPECT_EQ(y[m * 2 + 1], 0.0f) << name << " nibble order, col=" << col;
              }
            }
          }
          // matmul_t: y[c] += x[r] W(r, c) with x one-hot on row 0.
          auto ft = t->matmul_t[static_cast<int>(WeightFormat::kMXFP4)];
          if (ft != nullptr) {
            std::vector<float> x = {1.0f, 0.0f}, y(static_cast<size_t>(K), 0.0f);
            ft(w, 0, K, x.data(), 1, 2, y.data(), K);
            if (e == 255) {
              EXPECT_TRUE(std::isnan(y[col])) << name;
            } else {
              EXPECT_EQ(y[col], want)
                  << name << " matmul_t e=" << e << " code=" << code << " col=" << col;
              if (std::isfinite(want)) {
                EXPECT_EQ(y[col ^ 1], 0.0f) << name << " matmul_t nibble order";
              }
            }
          }
        }
      }
    }
  }
}

TEST(KernelsDispatch, ActiveTableIsTheBestAvailable) {
  if (const char* env = std::getenv("DELTAFIN_KERNELS"); env != nullptr && *env != '\0') {
    GTEST_SKIP() << "DELTAFIN_KERNELS=" << env << " forces the table";
  }
  const KernelTable& a = kernels::active();
  EXPECT_NE(a.name, nullptr);
  for (int f = 0; f < kWeightFormats; ++f) EXPECT_NE(a.matmul[f], nullptr);
  EXPECT_NE(a.dot, nullptr);
  EXPECT_NE(a.axpy, nullptr);
  if (kernels::avx512_table() != nullptr) {
    EXPECT_STREQ(a.name, "avx512");
  } else if (kernels::avx2_table() != nullptr) {
    EXPECT_STREQ(a.name, "avx2");
  } else if (kernels::neon_table() != nullptr) {
    EXPECT_STREQ(a.name, "neon");
  }
}

}  // namespace
}  // namespace deltafin
