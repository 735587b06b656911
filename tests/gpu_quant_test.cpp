// The Vulkan shaders for Kimi K2 / DeepSeek-V3's quantised weights (matmul.comp FORMAT 3: FP8
// E4M3 with 128x128 F32 block scales, FORMAT 4: INT4 pack-quantized with BF16 group scales),
// tested as gpu_test.cpp tests the MXFP4 one, on whatever Vulkan device the machine has
// (lavapipe without a GPU; each test skips, saying why, without Vulkan or a device): products
// against a float64 sum over the reference decoding on ragged shapes, GEMV and GEMM; the exact
// decoding, bit for bit, of the float64 reference's files (tests/data/quant) through the identity;
// weights cut into device pieces that start inside a 128-row scale block (FP8's row phase),
// transient and resident; the expert-grouped product against single products; and a row's result
// alone and in a batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "gpu/gpu.h"
#include "gpu_util.h"
#include "kernels/kernels.h"
#include "storage/checkpoint.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"
#include "test_util.h"

namespace deltafin {
namespace {

// A random FP8 or INT4 matrix (every finite code / every nibble, ordinary scales).
struct QMatrix {
  std::vector<uint8_t> data, scales;
  Matrix m;
  QMatrix(WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng) {
    m.format = f;
    m.rows = rows;
    m.cols = cols;
    data.resize(static_cast<size_t>(rows * m.row_bytes()));
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> u(0.5f, 1.0f);
    for (auto& b : data) {
      b = static_cast<uint8_t>(byte(rng));
      if (f == WeightFormat::kFP8 && (b & 0x7F) == 0x7F) b ^= 1;
    }
    scales.resize(static_cast<size_t>(m.scale_bytes()));
    if (f == WeightFormat::kFP8) {
      for (size_t i = 0; i < scales.size(); i += 4) {
        const float s = u(rng) / 448;
        std::memcpy(scales.data() + i, &s, 4);
      }
    } else {
      for (size_t i = 0; i < scales.size(); i += 2) {
        const uint16_t s = f32_to_bf16(u(rng) / 7.5f);
        std::memcpy(scales.data() + i, &s, 2);
      }
    }
    m.data = data.data();
    m.scales = scales.data();
  }
};

std::vector<float> random_x(int64_t M, int64_t ldx, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * ldx));
  for (auto& v : x) v = nd(rng);
  return x;
}

// max |y - sum_k x W| / sum_k |x W| over the outputs, the sums in float64 over matrix_element.
double rel_error(const Matrix& w, const float* x, int64_t M, int64_t ldx, const float* y,
                 int64_t ldy) {
  double worst = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < w.rows; ++n) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < w.cols; ++k) {
        const double t = static_cast<double>(x[m * ldx + k]) * matrix_element(w, n, k);
        ref += t;
        mag += std::fabs(t);
      }
      worst = std::max(worst, std::fabs(y[m * ldy + n] - ref) / std::max(mag, 1e-30));
    }
  }
  return worst;
}

struct Shape {
  WeightFormat format;
  int64_t N, K, M;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << weight_format_name(s.format) << " " << s.N << "x" << s.K << " M=" << s.M;
}

class GpuQuantMatmul : public ::testing::TestWithParam<Shape> {};

TEST_P(GpuQuantMatmul, MatchesFloat64Reference) {
  DELTAFIN_GPU_OR_SKIP(gpu);
  const Shape s = GetParam();
  std::mt19937 rng(static_cast<unsigned>(s.N * 131 + s.K * 7 + s.M));
  QMatrix w(s.format, s.N, s.K, rng);
  const int64_t ldx = s.K + 3, ldy = s.N + 5;
  std::vector<float> x = random_x(s.M, ldx, rng);
  std::vector<float> y(static_cast<size_t>(s.M * ldy), 7.0f);
  gpu->run(w.m, x.data(), s.M, ldx, y.data(), ldy, false);
  EXPECT_LE(rel_error(w.m, x.data(), s.M, ldx, y.data(), ldy), 1e-6);
  EXPECT_EQ(y[static_cast<size_t>(s.N)], 7.0f);  // the gap between rows is not written
  std::vector<float> yc(static_cast<size_t>(s.M * ldy));
  kernels::active().matmul[static_cast<int>(s.format)](w.m, 0, s.N, x.data(), s.M, ldx, yc.data(),
                                                       ldy, false);
  EXPECT_LE(rel_error(w.m, x.data(), s.M, ldx, yc.data(), ldy), 1e-6);
  EXPECT_EQ(gpu->stats().products, 1);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuQuantMatmul,
                         ::testing::Values(Shape{WeightFormat::kFP8, 5, 32, 1},
                                           Shape{WeightFormat::kFP8, 130, 300, 2},
                                           Shape{WeightFormat::kFP8, 200, 129, 19},
                                           Shape{WeightFormat::kInt4, 3, 8, 1},
                                           Shape{WeightFormat::kInt4, 41, 100, 3},
                                           Shape{WeightFormat::kInt4, 66, 256, 19}),
                         [](const auto& info) {
                           const Shape& s = info.param;
                           return std::string(weight_format_name(s.format)) + "_" +
                                  std::to_string(s.N) + "x" + std::to_string(s.K) + "_M" +
                                  std::to_string(s.M);
                         });

// The device decodes the float64 reference's cases to exactly its float32 weights: x = the
// identity, so y[m][n] = W[n][m] (every other term an exact zero).
TEST(GpuQuant, DecodesTheReferenceCasesExactly) {
  DELTAFIN_GPU_OR_SKIP(gpu);
  for (const char* file : {"fp8.safetensors", "int4.safetensors"}) {
    const std::string path = test::data_dir() + "/quant/" + file;
    const std::string bytes = test::slurp(path);
    std::map<std::string, TensorInfo> t;
    for (TensorInfo& i : parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                  bytes.size(), path))
      t[i.name] = i;
    const bool fp8 = std::string(file) == "fp8.safetensors";
    for (const std::string& n : fp8 ? std::vector<std::string>{"ragged", "special"}
                                    : std::vector<std::string>{"expert", "ragged"}) {
      const Matrix w =
          fp8 ? fp8_block_matrix(t.at(n + ".weight"), t.at(n + ".weight_scale_inv"))
              : int4_packed_matrix(t.at(n + ".weight_packed"), t.at(n + ".weight_scale"),
                                   int4_weight_shape(t.at(n + ".weight_shape")));
      const TensorInfo& e = t.at(n + ".expected");
      std::vector<float> want(static_cast<size_t>(e.numel()));
      std::memcpy(want.data(), e.data, want.size() * 4);
      const int64_t R = w.rows, C = w.cols;
      std::vector<float> x(static_cast<size_t>(C * C), 0.0f), y(static_cast<size_t>(C * R));
      for (int64_t k = 0; k < C; ++k) x[static_cast<size_t>(k * C + k)] = 1.0f;
      gpu->run(w, x.data(), C, C, y.data(), R, false);
      int64_t bad = 0;
      for (int64_t k = 0; k < C; ++k) {
        for (int64_t r = 0; r < R; ++r) {
          const float got = y[static_cast<size_t>(k * R + r)],
                      ref = want[static_cast<size_t>(r * C + k)];
          if (!(got == ref) && bad++ < 3)
            ADD_FAILURE() << file << " " << n << ": W[" << r << "," << k << "] = " << got
                          << " on the device, reference " << ref;
        }
      }
      EXPECT_EQ(bad, 0) << file << " " << n;
    }
  }
}

// 16 KiB buffers cut a 300-row FP8 matrix into pieces of 42 rows: pieces start at rows 42, 84,
// 126 (two rows before a scale block ends), ... so each carries its row phase. The result equals
// the uncut one bit for bit, transient and resident. INT4 the same way.
TEST(GpuQuant, PiecesStartInsideScaleBlocks) {
  DELTAFIN_GPU_OR_SKIP(small, o_.max_buffer = 16384);
  DELTAFIN_GPU_OR_SKIP(whole);
  std::mt19937 rng(36);
  // Both alive to the end: the backend keys resident weights by their address, which a matrix
  // allocated after another was freed could share.
  std::vector<QMatrix> ws;
  ws.emplace_back(WeightFormat::kFP8, 300, 192, rng);
  ws.emplace_back(WeightFormat::kInt4, 300, 192, rng);
  for (const QMatrix& w : ws) {
    const WeightFormat f = w.m.format;
    std::vector<float> x = random_x(7, 192, rng);
    std::vector<float> a(7 * 300), b(7 * 300);
    small->run(w.m, x.data(), 7, 192, a.data(), 300, false);
    whole->run(w.m, x.data(), 7, 192, b.data(), 300, false);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << weight_format_name(f);
    EXPECT_LE(rel_error(w.m, x.data(), 7, 192, a.data(), 300), 1e-6);
    ASSERT_TRUE(small->make_resident(w.m));
    std::fill(a.begin(), a.end(), 0.0f);
    ASSERT_TRUE(small->matmul(w.m, x.data(), 7, 192, a.data(), 300, false));
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << weight_format_name(f);
    // a row slice that starts inside a block, as the model's per-head slices do
    const Matrix s = w.m.row_slice(100, 231);
    std::vector<float> c(7 * 131);
    whole->run(s, x.data(), 7, 192, c.data(), 131, false);
    for (int64_t m = 0; m < 7; ++m)
      EXPECT_EQ(0, std::memcmp(c.data() + m * 131, b.data() + m * 300 + 100, 131 * 4))
          << weight_format_name(f) << " slice, row " << m;
  }
}

// The expert-grouped product: each expert's rows against its own W in one dispatch, equal bit
// for bit to the single-row products; and a row alone equals the same row in a batch.
TEST(GpuQuant, GroupedAndBatchedRowsMatchSingleProducts) {
  DELTAFIN_GPU_OR_SKIP(gpu);
  std::mt19937 rng(13);
  for (WeightFormat f : {WeightFormat::kFP8, WeightFormat::kInt4}) {
    const int64_t N = 19, K = 160, R = 40;
    std::vector<QMatrix> experts;
    for (int e = 0; e < 3; ++e) experts.emplace_back(f, N, K, rng);
    std::vector<float> x = random_x(R, K, rng);
    std::vector<std::vector<int32_t>> rows = {{0, 3, 39}, {}, {}};
    for (int32_t r = 1; r < R; r += 2) rows[2].push_back(r);  // 20 rows: two tiles
    std::vector<gpu::Group> groups;
    int64_t total = 0;
    for (int e = 0; e < 3; ++e) {
      groups.push_back({experts[e].m, rows[e]});
      total += static_cast<int64_t>(rows[e].size());
    }
    std::vector<float> y(static_cast<size_t>(total * N), -1.0f);
    gpu->run_grouped(groups, x.data(), K, y.data());
    int64_t at = 0;
    for (int e = 0; e < 3; ++e) {
      for (int32_t r : rows[e]) {
        std::vector<float> one(static_cast<size_t>(N));
        gpu->run(experts[e].m, x.data() + r * K, 1, K, one.data(), N, false);
        EXPECT_EQ(0, std::memcmp(one.data(), y.data() + at * N, one.size() * 4))
            << weight_format_name(f) << " expert " << e << " row " << r;
        EXPECT_LE(rel_error(experts[e].m, x.data() + r * K, 1, K, y.data() + at * N, N), 1e-6);
        ++at;
      }
    }
    std::vector<float> all(static_cast<size_t>(R * N));
    gpu->run(experts[0].m, x.data(), R, K, all.data(), N, false);
    for (int64_t m : {0, 17, 39}) {
      std::vector<float> one(static_cast<size_t>(N));
      gpu->run(experts[0].m, x.data() + m * K, 1, K, one.data(), N, false);
      EXPECT_EQ(0, std::memcmp(one.data(), all.data() + m * N, one.size() * 4)) << "row " << m;
    }
  }
}

}  // namespace
}  // namespace deltafin
