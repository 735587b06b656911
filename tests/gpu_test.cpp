// The Vulkan backend on whatever Vulkan device the machine has — lavapipe (Mesa's CPU driver)
// on CI and on machines without a GPU — against a float64 reference: every weight format, GEMV
// and GEMM, small and odd shapes, buffers split below the device limit, the expert-grouped
// product, the offload seam under Model::forward, and the CPU fallback. Each test skips with the
// reason when this build has no Vulkan backend or the machine no Vulkan device. Shapes stay
// small: lavapipe runs shaders about 15x slower than plain C.
#include "gpu/gpu.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/device_experts.h"
#include "engine/gpu_plan.h"
#include "gpu_util.h"
#include "kernels/kernels.h"
#include "model/layers.h"
#include "storage/checkpoint.h"
#include "storage/expert_directory.h"
#include "storage/trunk_units.h"
#include "tensor/dtype.h"
#include "test_util.h"

namespace deltafin {
namespace {

// A random matrix of `f` with its bytes.
struct TestMatrix {
  std::vector<uint8_t> data, scales;
  Matrix m;
  TestMatrix(WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng) {
    m.format = f;
    m.rows = rows;
    m.cols = cols;
    data.resize(static_cast<size_t>(rows * m.row_bytes()) + 3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> byte(0, 255), exp(118, 130);
    if (f == WeightFormat::kF32) {
      for (int64_t i = 0; i < rows * cols; ++i) {
        float v = nd(rng);
        std::memcpy(data.data() + i * 4, &v, 4);
      }
    } else if (f == WeightFormat::kBF16) {
      for (int64_t i = 0; i < rows * cols; ++i) {
        uint16_t h = f32_to_bf16(nd(rng));
        std::memcpy(data.data() + i * 2, &h, 2);
      }
    } else {
      for (auto& b : data) b = static_cast<uint8_t>(byte(rng));
      scales.resize(static_cast<size_t>(rows * m.scale_row_bytes()));
      for (auto& s : scales) s = static_cast<uint8_t>(exp(rng));
      m.scales = scales.data();
    }
    m.data = data.data();
  }
};

std::vector<float> random_x(int64_t M, int64_t ldx, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * ldx));
  for (auto& v : x) v = nd(rng);
  return x;
}

// max over elements of |y - ref| / sum_k |x_k W(n,k)|: the error relative to the size of the
// terms summed, which fp32 summation order alone keeps near K * 2^-24 (cancellation in the sum
// does not inflate it).
double rel_error(const Matrix& w, const float* x, int64_t M, int64_t ldx, const float* y,
                 int64_t ldy, const float* y0 = nullptr) {
  double worst = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < w.rows; ++n) {
      double ref = y0 != nullptr ? y0[m * ldy + n] : 0.0, mag = std::fabs(ref);
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

class GpuMatmul : public ::testing::TestWithParam<Shape> {};

TEST_P(GpuMatmul, MatchesFloat64Reference) {
  DELTAFIN_GPU_OR_SKIP(gpu);
  const Shape s = GetParam();
  std::mt19937 rng(static_cast<unsigned>(s.N * 131 + s.K * 7 + s.M));
  TestMatrix w(s.format, s.N, s.K, rng);
  const int64_t ldx = s.K + 3, ldy = s.N + 5;
  std::vector<float> x = random_x(s.M, ldx, rng);
  std::vector<float> y(static_cast<size_t>(s.M * ldy), 7.0f);
  gpu->run(w.m, x.data(), s.M, ldx, y.data(), ldy, false);
  EXPECT_LE(rel_error(w.m, x.data(), s.M, ldx, y.data(), ldy), 1e-6);
  EXPECT_EQ(y[static_cast<size_t>(s.N)], 7.0f);  // the gap between rows is not written
  // accumulate adds to what y holds
  std::vector<float> y0 = y;
  gpu->run(w.m, x.data(), s.M, ldx, y.data(), ldy, true);
  EXPECT_LE(rel_error(w.m, x.data(), s.M, ldx, y.data(), ldy, y0.data()), 1e-6);
  // and the CPU table agrees to the same tolerance
  std::vector<float> yc(static_cast<size_t>(s.M * ldy));
  kernels::active().matmul[static_cast<int>(s.format)](w.m, 0, s.N, x.data(), s.M, ldx, yc.data(),
                                                       ldy, false);
  EXPECT_LE(rel_error(w.m, x.data(), s.M, ldx, yc.data(), ldy), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuMatmul,
    ::testing::Values(Shape{WeightFormat::kF32, 7, 13, 1}, Shape{WeightFormat::kF32, 33, 65, 5},
                      Shape{WeightFormat::kBF16, 1, 1, 1}, Shape{WeightFormat::kBF16, 9, 31, 1},
                      Shape{WeightFormat::kBF16, 67, 129, 3},
                      Shape{WeightFormat::kBF16, 70, 200, 37},
                      Shape{WeightFormat::kMXFP4, 5, 32, 1}, Shape{WeightFormat::kMXFP4, 41, 96, 2},
                      Shape{WeightFormat::kMXFP4, 66, 256, 19}),
    [](const auto& info) {
      const Shape& s = info.param;
      return std::string(weight_format_name(s.format)) + "_" + std::to_string(s.N) + "x" +
             std::to_string(s.K) + "_M" + std::to_string(s.M);
    });

// A row's result does not depend on how many other rows share the product (GEMV == GEMM, bit
// for bit), as the CPU kernels guarantee.
TEST(Gpu, RowResultDoesNotDependOnBatch) {
  DELTAFIN_GPU_OR_SKIP(gpu);
  std::mt19937 rng(5);
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kMXFP4}) {
    TestMatrix w(f, 23, 160, rng);
    std::vector<float> x = random_x(21, 160, rng);
    std::vector<float> all(21 * 23), one(23);
    gpu->run(w.m, x.data(), 21, 160, all.data(), 23, false);
    for (int64_t m : {0, 7, 20}) {
      gpu->run(w.m, x.data() + m * 160, 1, 160, one.data(), 23, false);
      EXPECT_EQ(0, std::memcmp(one.data(), all.data() + m * 23, 23 * 4)) << "row " << m;
    }
  }
}

// Buffers capped at 16 KiB: W is cut into row pieces and x / y into row blocks; the result is
// the same as in one piece.
TEST(Gpu, SplitsBuffersAboveTheLimit) {
  DELTAFIN_GPU_OR_SKIP(small, o_.max_buffer = 16384);
  DELTAFIN_GPU_OR_SKIP(whole);
  std::mt19937 rng(9);
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kMXFP4, WeightFormat::kF32}) {
    TestMatrix w(f, 101, 192, rng);                 // bf16: 37 KiB, > 2 pieces
    std::vector<float> x = random_x(50, 192, rng);  // 37 KiB of x: 3 blocks
    std::vector<float> a(50 * 101), b(50 * 101);
    small->run(w.m, x.data(), 50, 192, a.data(), 101, false);
    whole->run(w.m, x.data(), 50, 192, b.data(), 101, false);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << weight_format_name(f);
    EXPECT_LE(rel_error(w.m, x.data(), 50, 192, a.data(), 101), 1e-6);
    // resident weights are cut the same way
    ASSERT_TRUE(small->make_resident(w.m));
    std::fill(a.begin(), a.end(), 0.0f);
    ASSERT_TRUE(small->matmul(w.m, x.data(), 50, 192, a.data(), 101, false));
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << weight_format_name(f);
  }
}

// Discrete GPUs' path on lavapipe: nothing mapped or imported, every copy in and out through
// the staging buffer; the same bits as the mapped path.
TEST(Gpu, StagedCopiesGiveTheSameResults) {
  DELTAFIN_GPU_OR_SKIP(staged, o_.staged = true);
  DELTAFIN_GPU_OR_SKIP(mapped);
  std::mt19937 rng(11);
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kMXFP4}) {
    TestMatrix w(f, 45, 96, rng);
    std::vector<float> x = random_x(9, 96, rng);
    std::vector<float> a(9 * 45), b(9 * 45);
    staged->run(w.m, x.data(), 9, 96, a.data(), 45, false);
    mapped->run(w.m, x.data(), 9, 96, b.data(), 45, false);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << weight_format_name(f);
    ASSERT_TRUE(staged->make_resident(w.m));
    EXPECT_GT(staged->resident_bytes(), 0u);  // copied into device memory, counted
    std::fill(a.begin(), a.end(), 0.0f);
    ASSERT_TRUE(staged->matmul(w.m, x.data(), 9, 96, a.data(), 45, false));
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << weight_format_name(f);
  }
  EXPECT_GT(staged->stats().uploaded_bytes, 0u);
  EXPECT_EQ(staged->stats().imported_bytes, 0u);
}

// Each row of a grouped product's y against the single-row product of its expert (bit for bit)
// and the float64 reference (1e-6).
void expect_rows_match_single_products(gpu::Backend& gpu, const std::vector<TestMatrix>& experts,
                                       const std::vector<std::vector<int32_t>>& rows,
                                       const float* x, int64_t K, const float* y) {
  int64_t at = 0;
  for (size_t e = 0; e < experts.size(); ++e) {
    const Matrix& w = experts[e].m;
    for (int32_t r : rows[e]) {
      std::vector<float> one(static_cast<size_t>(w.rows));
      gpu.run(w, x + r * K, 1, K, one.data(), w.rows, false);
      EXPECT_EQ(0, std::memcmp(one.data(), y + at * w.rows, one.size() * 4)) << "expert " << e;
      EXPECT_LE(rel_error(w, x + r * K, 1, K, y + at * w.rows, w.rows), 1e-6);
      ++at;
    }
  }
}

// The expert-grouped product: each expert's rows (any subset of x, any order) against its own
// W, in one dispatch; equal bit for bit to the per-expert products.
TEST(Gpu, GroupedProductMatchesPerExpertProducts) {
  DELTAFIN_GPU_OR_SKIP(gpu);
  std::mt19937 rng(13);
  for (WeightFormat f : {WeightFormat::kMXFP4, WeightFormat::kBF16}) {
    const int64_t N = 19, K = 64, R = 40;
    std::vector<TestMatrix> experts;
    for (int e = 0; e < 4; ++e) experts.emplace_back(f, N, K, rng);
    std::vector<float> x = random_x(R, K, rng);
    std::vector<std::vector<int32_t>> rows = {{0, 3, 39}, {}, {5}, {}};
    for (int32_t r = 1; r < R; r += 2) rows[3].push_back(r);  // 20 rows: two tiles
    std::vector<gpu::Group> groups;
    int64_t total = 0;
    for (int e = 0; e < 4; ++e) {
      groups.push_back({experts[e].m, rows[e]});
      total += static_cast<int64_t>(rows[e].size());
    }
    std::vector<float> y(static_cast<size_t>(total * N), -1.0f);
    gpu->run_grouped(groups, x.data(), K, y.data());
    expect_rows_match_single_products(*gpu, experts, rows, x.data(), K, y.data());
  }
}

// The grouped product as a pipeline: eight experts (one without rows, one with more rows than a
// buffer holds) in batches, each uploaded into one of two buffer sets while the device computes
// the batch before it, mapped and through the staging buffer of discrete GPUs. Every row equals
// the single-row product bit for bit, each expert's weights are uploaded once (the one cut in
// two: once per part), and later batches' uploads overlapped earlier batches' compute.
TEST(Gpu, GroupedBatchesOverlapUploadsWithCompute) {
  for (bool staged : {false, true}) {
    // 6 KiB buffers: 24 rows of 64 floats per x block
    DELTAFIN_GPU_OR_SKIP(gpu, o_.staged = staged; o_.max_buffer = 6144);
    std::mt19937 rng(29);
    const int64_t N = 24, K = 64, R = 48;
    std::vector<TestMatrix> experts;
    for (int e = 0; e < 8; ++e) experts.emplace_back(WeightFormat::kMXFP4, N, K, rng);
    std::vector<float> x = random_x(R, K, rng);
    const std::vector<int> counts = {3, 0, 30, 1, 5, 17, 2, 9};
    std::vector<std::vector<int32_t>> rows(8);
    std::uniform_int_distribution<int32_t> pick(0, R - 1);
    std::vector<gpu::Group> groups;
    int64_t total = 0;
    for (int e = 0; e < 8; ++e) {
      for (int i = 0; i < counts[static_cast<size_t>(e)]; ++i) rows[e].push_back(pick(rng));
      groups.push_back({experts[e].m, rows[e]});
      total += counts[static_cast<size_t>(e)];
    }
    std::vector<float> y(static_cast<size_t>(total * N), -1.0f);
    gpu->run_grouped(groups, x.data(), K, y.data());
    const gpu::Stats st = gpu->stats();
    EXPECT_EQ(st.grouped_products, 1);
    EXPECT_GE(st.products, 4);                                                    // batches
    EXPECT_EQ(st.expert_bytes, static_cast<uint64_t>(8 * experts[0].m.bytes()));  // 7 + 1 cut
    EXPECT_GT(st.overlapped_bytes, 0u);
    EXPECT_LT(st.overlapped_bytes, st.expert_bytes);  // the first batch had nothing to overlap
    expect_rows_match_single_products(*gpu, experts, rows, x.data(), K, y.data());
  }
}

// Through the seam: kernels::matmul under an OffloadScope goes to the device for products of
// at least min_rows rows or resident weights, to the CPU otherwise; int8 is always the CPU's.
TEST(Gpu, OffloadSeamTakesProductsByRowsAndResidency) {
  DELTAFIN_GPU_OR_SKIP(gpu, o_.min_rows = 4);
  std::mt19937 rng(17);
  TestMatrix w(WeightFormat::kBF16, 24, 64, rng);
  std::vector<float> x = random_x(8, 64, rng);
  std::vector<float> y(8 * 24);
  ThreadPool pool(1);
  const kernels::OffloadScope scope(gpu.get());
  kernels::matmul(w.m, x.data(), 2, 64, y.data(), 24, pool);  // too few rows: CPU
  EXPECT_EQ(gpu->stats().products, 0);
  EXPECT_EQ(gpu->stats().declined, 1);
  kernels::matmul(w.m, x.data(), 8, 64, y.data(), 24, pool);  // uploaded for this product
  EXPECT_EQ(gpu->stats().products, 1);
  EXPECT_LE(rel_error(w.m, x.data(), 8, 64, y.data(), 24), 1e-6);
  ASSERT_TRUE(gpu->make_resident(w.m));
  kernels::matmul(w.m, x.data(), 1, 64, y.data(), 24, pool);  // resident: even one row
  EXPECT_EQ(gpu->stats().products, 2);
  Matrix int8 = w.m;
  int8.format = WeightFormat::kInt8;
  EXPECT_FALSE(gpu->make_resident(int8));
  EXPECT_FALSE(gpu->matmul(int8, x.data(), 8, 64, y.data(), 24, false));
}

// A device the test owns, as the engine's DeviceExperts and pass environment hold one.
std::shared_ptr<kernels::MatmulOffload> borrowed(gpu::Backend& device) {
  return std::shared_ptr<kernels::MatmulOffload>(&device, [](kernels::MatmulOffload*) {});
}

// Each K3 layer of the golden models (dense MLP, KDA, MLA, MoE with shared and routed experts)
// on identical inputs, with every product offloaded (min_rows 1) against the CPU layer; the
// routed experts through the engine's DeviceExperts, as a model with --gpu has them.
class GpuLayers : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuLayers, EveryLayerMatchesTheCpuLayer) {
  DELTAFIN_GPU_OR_SKIP(gpu);
  const std::string dir = test::data_dir() + "/" + GetParam() + "/model";
  const ModelConfig c = load_config(dir);
  std::unique_ptr<Checkpoint> ck = Checkpoint::open(dir);
  ResidentTrunk trunk(c, *ck);
  const ExpertFormat ef = check_inventory(c, *ck).expert_format;
  MmapExpertProvider experts(c, *ck, ef);
  DeviceExperts on_device(std::make_unique<MmapExpertProvider>(c, *ck, ef), borrowed(*gpu));
  ThreadPool pool(2);
  const int64_t R = 21, H = c.hidden;
  std::mt19937 rng(21);
  std::vector<float> u = random_x(R, H, rng);
  int kinds = 0;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& w = trunk.acquire(layer);
    for (int part = 0; part < 2; ++part) {  // the mixer, then the FFN
      std::vector<float> y[2];
      for (int on = 0; on < 2; ++on) {
        State st(c);
        SeqRows seq{0, R, &st, nullptr, 0};
        LayerContext ctx{c, pool, std::span<const SeqRows>(&seq, 1), R};
        y[on].assign(static_cast<size_t>(R * H), 0.0f);
        const kernels::OffloadScope scope(on ? gpu.get() : nullptr);
        if (part == 0 && c.is_mla(layer)) {
          mla_forward(ctx, w.mla, layer, u.data(), y[on].data());
        } else if (part == 0) {
          kda_forward(ctx, w.kda, layer, u.data(), y[on].data());
        } else if (c.is_dense(layer)) {
          mlp_forward(ctx, w.dense, u.data(), y[on].data(), false);
        } else {
          ExpertProvider& ex = on ? static_cast<ExpertProvider&>(on_device) : experts;
          moe_forward(ctx, w.moe, ex, layer, u.data(), y[on].data());
        }
      }
      double diff = 0, mag = 0;
      for (size_t i = 0; i < y[0].size(); ++i) {
        diff = std::max(diff, static_cast<double>(std::fabs(y[0][i] - y[1][i])));
        mag = std::max(mag, static_cast<double>(std::fabs(y[0][i])));
      }
      EXPECT_GT(mag, 0.0);
      EXPECT_LE(diff / mag, 2e-5) << "layer " << layer << (part ? " ffn" : " mixer");
      ++kinds;
    }
    trunk.release(layer);
  }
  EXPECT_EQ(kinds, 2 * c.num_layers);
  EXPECT_GT(gpu->stats().products, 0);
  EXPECT_EQ(gpu->stats().declined, 0);  // nothing fell back to the CPU
  EXPECT_FALSE(gpu->failed());
}

// The first MoE layer of a golden model over R random rows: its CPU output, and the same layer
// with only run_experts() given to the device (route() and finish() stay on the CPU) through
// the engine's DeviceExperts, inside the pass environment a --gpu model runs in.
struct MoeLayer {
  ModelConfig c;
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<ResidentTrunk> trunk;
  std::unique_ptr<MmapExpertProvider> experts;
  ThreadPool pool{2};
  int layer;
  const MoeTrunkWeights* w = nullptr;
  std::vector<float> u, cpu;
  std::unique_ptr<State> st;
  SeqRows seq;
  std::unique_ptr<LayerContext> ctx;

  MoeLayer(const std::string& model, int64_t R, uint32_t seed) {
    const std::string dir = test::data_dir() + "/" + model + "/model";
    c = load_config(dir);
    ck = Checkpoint::open(dir);
    trunk = std::make_unique<ResidentTrunk>(c, *ck);
    experts = std::make_unique<MmapExpertProvider>(c, *ck, check_inventory(c, *ck).expert_format);
    layer = static_cast<int>(c.first_k_dense);
    w = &trunk->acquire(layer).moe;
    std::mt19937 rng(seed);
    u = random_x(R, c.hidden, rng);
    st = std::make_unique<State>(c);
    seq = {0, R, st.get(), nullptr, 0};
    ctx =
        std::make_unique<LayerContext>(LayerContext{c, pool, std::span<const SeqRows>(&seq, 1), R});
    cpu.assign(static_cast<size_t>(R * c.hidden), 0.0f);
    moe_forward(*ctx, *w, *experts, layer, u.data(), cpu.data());
  }
  ~MoeLayer() { trunk->release(layer); }
  std::vector<float> on(gpu::Backend& device) {
    std::vector<float> y(cpu.size());
    DeviceExperts dev(
        std::make_unique<MmapExpertProvider>(c, *ck, check_inventory(c, *ck).expert_format),
        borrowed(device));
    MoePass moe(*ctx, *w, ctx->rows);
    moe.route(*ctx, 0, u.data());
    offload_environment(borrowed(device))([&] { moe.run_experts(dev, layer, {}); });
    moe.finish(*ctx, 0, u.data(), y.data());
    return y;
  }
};

// The MoE of a prefill pass (rows >= min_rows) with the device taking its routed experts as
// grouped products: gate/up then down per window of experts, each chosen expert's weights
// uploaded exactly once for the pass and no expert product left to the CPU; the layer agrees
// with the CPU layer to fp32 summation order.
TEST_P(GpuLayers, MoePassRunsEachExpertGroupedOnce) {
  DELTAFIN_GPU_OR_SKIP(gpu, o_.min_rows = 16);
  MoeLayer m(GetParam(), 40, 31);
  // what the pass must upload: every chosen expert's three matrices, once
  const Routing routing = route_rows(*m.ctx, m.w->router, m.w->score_bias, m.u.data());
  uint64_t want = 0;
  for (int e : routing.experts) {
    ExpertHandle h = m.experts->acquire(m.layer, e);
    want += static_cast<uint64_t>(h->w1.bytes() + h->w2.bytes() + h->w3.bytes());
  }
  const std::vector<float> dev = m.on(*gpu);
  const gpu::Stats s = gpu->stats();
  const auto windows = static_cast<int64_t>((routing.experts.size() + 15) / 16);
  EXPECT_EQ(s.grouped_products, 2 * windows);  // gate/up, then down, per window
  EXPECT_EQ(s.expert_bytes, want);
  EXPECT_EQ(s.declined, 0);
  double diff = 0, mag = 0;
  for (size_t i = 0; i < dev.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(m.cpu[i] - dev[i])));
    mag = std::max(mag, static_cast<double>(std::fabs(m.cpu[i])));
  }
  EXPECT_GT(mag, 0.0);
  EXPECT_LE(diff / mag, 1e-5);
}

// A grouped product the device cannot run (an expert larger than the capped buffer) is a device
// error: said once, and the pass's experts then run on the CPU with exactly the CPU's result.
TEST_P(GpuLayers, MoeDeviceErrorRunsTheExpertsOnTheCpu) {
  DELTAFIN_GPU_OR_SKIP(gpu, o_.min_rows = 16; o_.max_buffer = 256);
  MoeLayer m(GetParam(), 24, 37);
  ::testing::internal::CaptureStderr();
  const std::vector<float> dev = m.on(*gpu);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(dev, m.cpu);
  EXPECT_TRUE(gpu->failed());
  EXPECT_EQ(gpu->stats().grouped_products, 0);
  const size_t first = err.find("[gpu] device error");
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("[gpu] device error", first + 1), std::string::npos) << err;
}

INSTANTIATE_TEST_SUITE_P(Golden, GpuLayers, ::testing::Values("k3-tiny-mxfp4", "k3-tiny-bf16"),
                         [](const auto& info) { return info.param.substr(8); });

// A product the device cannot run (here: an x row larger than the 1 KiB buffer cap) is an
// error of the device path: said once on stderr, the product and every later one computed by
// the CPU, with the CPU's result.
TEST(Gpu, DeviceErrorFallsBackToTheCpuSaidOnce) {
  DELTAFIN_GPU_OR_SKIP(gpu, o_.max_buffer = 1024);
  std::mt19937 rng(23);
  TestMatrix w(WeightFormat::kBF16, 8, 512, rng);
  std::vector<float> x = random_x(2, 512, rng);
  std::vector<float> y(16, 0.0f), ref(16, 0.0f);
  kernels::active().matmul[1](w.m, 0, 8, x.data(), 2, 512, ref.data(), 8, false);
  ThreadPool pool(1);
  const kernels::OffloadScope scope(gpu.get());
  ::testing::internal::CaptureStderr();
  kernels::matmul(w.m, x.data(), 2, 512, y.data(), 8, pool);
  kernels::matmul(w.m, x.data(), 2, 512, y.data(), 8, pool);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(gpu->failed());
  EXPECT_EQ(gpu->stats().declined, 2);
  const size_t first = err.find("[gpu] device error");
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("[gpu] device error", first + 1), std::string::npos) << err;
  EXPECT_NE(err.find("the CPU computes everything from here on"), std::string::npos) << err;
  EXPECT_EQ(y, ref);
  EXPECT_FALSE(gpu->make_resident(w.m));
}

TEST(Gpu, SelectionLineAndBadChoices) {
  std::string line;
  EXPECT_EQ(gpu::Backend::open({"off"}, line), nullptr);
  EXPECT_NE(line.find("off"), std::string::npos);
  // auto never picks a CPU device (lavapipe): with none but it, the line says so
  gpu::Probe p = gpu::probe();
  bool real_gpu = false;
  for (const auto& d : p.devices) real_gpu = real_gpu || d.type != "cpu";
  auto b = gpu::Backend::open({"auto"}, line);
  EXPECT_EQ(b != nullptr, real_gpu) << line;
  if (!real_gpu) {
    EXPECT_NE(line.find("running on the CPU"), std::string::npos) << line;
  }
  EXPECT_THROW(gpu::Backend::open({"seven"}, line), InvalidArgument);
  EXPECT_THROW(gpu::Backend::open({"99"}, line), InvalidArgument);
}

// The device-memory plan: with copies (the discrete-GPU path) and a budget of about half the
// trunk, the first units are resident and the rest are not; the split is said in one line.
TEST(GpuPlan, ResidentUnitsFollowTheBudget) {
  DELTAFIN_GPU_OR_SKIP(probe_only);
  const std::string dir = test::data_dir() + "/k3-tiny-bf16/model";
  const ModelConfig c = load_config(dir);
  std::unique_ptr<Checkpoint> ck = Checkpoint::open(dir);
  ResidentTrunk trunk(c, *ck);
  uint64_t layer_bytes = layer_trunk_bytes(c, 1, *ck);
  gpu::Options o{"0", layer_bytes * 5, 16, 0, true};
  std::vector<bool> stable(static_cast<size_t>(c.num_layers) + 1, true);
  stable[2] = false;  // a streamed unit is never made resident
  GpuPlan plan;
  std::shared_ptr<gpu::Backend> b = attach_gpu(o, c, trunk, stable, plan);
  ASSERT_TRUE(b);
  EXPECT_FALSE(plan.resident[2]);
  int n = 0;
  for (bool r : plan.resident) n += r ? 1 : 0;
  EXPECT_GE(n, 2);
  EXPECT_LT(n, c.num_layers);
  EXPECT_TRUE(plan.resident[0]);
  EXPECT_LE(b->resident_bytes(), o.memory);
  EXPECT_EQ(b->resident_bytes(), plan.resident_bytes);
  EXPECT_NE(plan.describe().find(fmt::format("{} of {} trunk units resident", n, c.num_layers + 1)),
            std::string::npos)
      << plan.describe();
  EXPECT_NE(plan.device.find("[gpu] using Vulkan device 0"), std::string::npos);
  // off: no backend, the line says so
  EXPECT_EQ(attach_gpu({"off"}, c, trunk, stable, plan), nullptr);
  EXPECT_NE(plan.device.find("off"), std::string::npos);
}

// Through the binary: a malformed --gpu is a usage error (exit 2), a missing device a one-line
// runtime error naming it.
TEST(GpuCli, BadDeviceChoicesAreOneLineErrors) {
  const std::string g = test::data_dir() + "/k3-tiny-bf16/model";
  const std::string out = test::temp_dir("gpu_cli") + "/logits.f32";
  auto r =
      test::run_deltafin({"logits", "--model", g, "--tokens", "1", "--out", out, "--gpu", "seven"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--gpu"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("expected auto, off or a device index"), std::string::npos) << r.err;
  r = test::run_deltafin({"logits", "--model", g, "--tokens", "1", "--out", out, "--gpu", "99"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("deltafin: --gpu 99: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// A machine whose Vulkan loader finds no driver (VK_ICD_FILENAMES naming nothing): --gpu auto
// says so and runs on the CPU, --gpu 0 is an error, and tools/gpu-check.sh stops with a clear
// verdict instead of measuring nothing.
TEST(GpuCli, NoDriverMeansCpuAndAClearVerdict) {
  struct Env {
    Env() { ::setenv("VK_ICD_FILENAMES", "/nonexistent/deltafin_no_icd.json", 1); }
    ~Env() { ::unsetenv("VK_ICD_FILENAMES"); }
  } env;
  const std::string g = test::data_dir() + "/k3-tiny-bf16/model";
  const std::string dir = test::temp_dir("gpu_nodriver");
  auto r = test::run_deltafin(
      {"logits", "--model", g, "--tokens", "1,2", "--out", dir + "/l.f32", "--gpu", "auto"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("[gpu] auto: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("running on the CPU"), std::string::npos) << r.err;
  r = test::run_deltafin(
      {"logits", "--model", g, "--tokens", "1", "--out", dir + "/l.f32", "--gpu", "0"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("deltafin: --gpu 0: no Vulkan device"), std::string::npos) << r.err;
  // the device script, with the build this test belongs to
  std::string build = test::binary();
  build = build.substr(0, build.rfind("/src/cli/"));
  const std::string source = test::data_dir() + "/../..";  // tests/data
  const std::string cmd =
      "SKIP_BUILD=1 WORK=" + dir + " bash " + source + "/tools/gpu-check.sh " + build + " 2>&1";
  std::string text;
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) text.append(buf, n);
  const int status = ::pclose(p);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << text;
  EXPECT_TRUE(text.find("NO VULKAN") != std::string::npos ||
              text.find("no GPU chosen") != std::string::npos)
      << text;
}

}  // namespace
}  // namespace deltafin
