// Kernel benchmarks at Kimi K3 sizes, through the threaded front end (kernels::matmul) and the
// active table (DELTAFIN_KERNELS=scalar|avx2|avx512|neon to force one):
//   decode (M = 1) reports GB/s of weight bytes streamed — compare with MemoryBandwidth below;
//   prefill (M = 64) reports GFLOP/s (2 M N K per product).
// Shapes: the BF16 trunk [12288 x 7168] and [7168 x 12288], one MXFP4 expert's [3072 x 3584]
// (gate/up) and [3584 x 3072] (down), and the MLA absorbed product matmul_t over [128 x 512]
// (one head of kv_b). A single expert fits in L3, so the MXFP4 decode benchmarks rotate over
// enough distinct experts (>= 160 MB) that every product streams from DRAM, as in real decoding.
// QuantProduct: Kimi K2 / DeepSeek-V3's FP8 and INT4 weights at K2's expert and dense shapes.
// Each benchmark takes a second or so; arguments are (threads). FmaPeak and GemmEfficiency state
// prefill GEMM speed as a share of the FMA peak measured on the same threads.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "core/sysinfo.h"
#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "tensor/matrix.h"

namespace deltafin {
namespace {

uint64_t g_rng = 0x9E3779B97F4A7C15ull;
uint64_t next_rand() {  // xorshift64*: fast enough to fill hundreds of MB
  g_rng ^= g_rng >> 12;
  g_rng ^= g_rng << 25;
  g_rng ^= g_rng >> 27;
  return g_rng * 0x2545F4914F6CDD1Dull;
}

struct OwnedMatrix {
  std::vector<uint8_t> data, scales;
  Matrix m;
};

std::unique_ptr<OwnedMatrix> make(WeightFormat f, int64_t rows, int64_t cols) {
  auto o = std::make_unique<OwnedMatrix>();
  o->m.format = f;
  o->m.rows = rows;
  o->m.cols = cols;
  o->data.resize(static_cast<size_t>(rows * o->m.row_bytes()));
  uint8_t* d = o->data.data();
  size_t n = o->data.size();
  if (f == WeightFormat::kF32) {
    // Floats in [-1, 1] (no denormals, which would time the FPU's slow path).
    for (size_t i = 0; i + 4 <= n; i += 4) {
      const float v = static_cast<float>(static_cast<int64_t>(next_rand() % 2001) - 1000) * 1e-3f;
      std::memcpy(d + i, &v, 4);
    }
  } else if (f == WeightFormat::kBF16) {
    // Finite bf16 values of magnitude ~2^-7 .. 2^-6.
    for (size_t i = 0; i + 8 <= n; i += 8) {
      uint64_t r = (next_rand() & 0x807F807F807F807Full) | 0x3C003C003C003C00ull;
      std::memcpy(d + i, &r, 8);
    }
  } else {
    for (size_t i = 0; i + 8 <= n; i += 8) {
      uint64_t r = next_rand();
      std::memcpy(d + i, &r, 8);
    }
  }
  if (f == WeightFormat::kMXFP4) {
    o->scales.resize(static_cast<size_t>(rows * o->m.scale_row_bytes()));
    for (auto& s : o->scales) s = static_cast<uint8_t>(120 + next_rand() % 10);
    o->m.scales = o->scales.data();
  }
  if (f == WeightFormat::kFP8) {  // every finite code; F32 block scales ~ amax / 448
    for (auto& b : o->data)
      if ((b & 0x7F) == 0x7F) b ^= 1;
    o->scales.resize(static_cast<size_t>(o->m.scale_bytes()));
    for (size_t i = 0; i < o->scales.size(); i += 4) {
      const float sc = static_cast<float>(1 + next_rand() % 64) / (448.0f * 64);
      std::memcpy(o->scales.data() + i, &sc, 4);
    }
    o->m.scales = o->scales.data();
  }
  if (f == WeightFormat::kInt4) {  // every nibble; BF16 group scales ~ amax / 7.5
    o->scales.resize(static_cast<size_t>(o->m.scale_bytes()));
    for (size_t i = 0; i < o->scales.size(); i += 2) {
      const uint16_t sc = static_cast<uint16_t>(0x3C00 + next_rand() % 128);  // 2^-7 .. 2^-6
      std::memcpy(o->scales.data() + i, &sc, 2);
    }
    o->m.scales = o->scales.data();
  }
  o->m.data = o->data.data();
  return o;
}

std::vector<float> activations(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(static_cast<int64_t>(next_rand() % 2001) - 1000) * 1e-3f;
  return v;
}

// A set of same-shaped matrices whose total size exceeds the caches (one for the BF16 trunk).
struct MatrixSet {
  std::vector<std::unique_ptr<OwnedMatrix>> items;
  int64_t bytes_each = 0;
};

MatrixSet& matrices(WeightFormat f, int64_t rows, int64_t cols, bool hot = false) {
  static std::vector<std::pair<std::tuple<int, int64_t, int64_t, bool>, std::unique_ptr<MatrixSet>>>
      cache;
  auto key = std::make_tuple(static_cast<int>(f), rows, cols, hot);
  for (auto& [k, v] : cache)
    if (k == key) return *v;
  auto s = std::make_unique<MatrixSet>();
  s->items.push_back(make(f, rows, cols));
  s->bytes_each = s->items[0]->m.bytes();
  const int64_t want = hot ? 0 : int64_t{160} << 20;
  while (static_cast<int64_t>(s->items.size()) * s->bytes_each < want)
    s->items.push_back(make(f, rows, cols));
  cache.emplace_back(key, std::move(s));
  return *cache.back().second;
}

ThreadPool& pool_of(int threads) {
  static std::vector<std::unique_ptr<ThreadPool>> pools(65);
  if (!pools[threads]) pools[threads] = std::make_unique<ThreadPool>(threads);
  return *pools[threads];
}

// Times `product(w, x, y, pool)` over the matrices of a set (round robin, so the weights come
// from RAM unless the set is `hot`); x holds M rows of x_len, y M rows of y_len. Reports weight
// GB/s and GFLOP/s.
// `threads` < 0: the benchmark's first argument.
template <class Product>
void run_products(benchmark::State& state, MatrixSet& set, int64_t rows, int64_t cols, int64_t M,
                  int64_t x_len, int64_t y_len, Product product, int threads = -1) {
  ThreadPool& pool = pool_of(threads < 0 ? static_cast<int>(state.range(0)) : threads);
  std::vector<float> x = activations(M * x_len);
  std::vector<float> y(static_cast<size_t>(M * y_len));
  size_t i = 0;
  int64_t products = 0;
  for (auto _ : state) {
    const Matrix& w = set.items[i]->m;
    i = (i + 1) % set.items.size();
    product(w, x.data(), y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    ++products;
  }
  const double n = static_cast<double>(products);
  state.counters["GB/s"] = benchmark::Counter(n * static_cast<double>(set.bytes_each) / 1e9,
                                              benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(n * 2.0 * static_cast<double>(M) * static_cast<double>(rows) *
                             static_cast<double>(cols) / 1e9,
                         benchmark::Counter::kIsRate);
  state.SetLabel(kernels::active().name);
}

void run_matmul(benchmark::State& state, WeightFormat f, int64_t rows, int64_t cols, int64_t M,
                bool hot = false, int threads = -1) {
  run_products(
      state, matrices(f, rows, cols, hot), rows, cols, M, cols, rows,
      [&](const Matrix& w, const float* x, float* y, ThreadPool& pool) {
        kernels::matmul(w, x, M, cols, y, rows, pool, false);
      },
      threads);
}

void run_matmul_t(benchmark::State& state, int64_t rows, int64_t cols, int64_t M) {
  run_products(state, matrices(WeightFormat::kBF16, rows, cols), rows, cols, M, rows, cols,
               [&](const Matrix& w, const float* x, float* y, ThreadPool& pool) {
                 kernels::matmul_t(w, x, M, rows, y, cols, pool);
               });
}

// Read bandwidth of this machine (the roofline for decoding): sysinfo's probe over 256 MB.
void MemoryBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  double bw = 0;
  for (auto _ : state) bw = measure_memory_bandwidth(threads);
  state.counters["GB/s"] = bw / 1e9;
}

// The same with the active table's dot over two 128 MB arrays, split across the threads: what
// SIMD loads can stream from DRAM here.
void DotBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t n = int64_t{32} << 20;  // floats per array
  static std::vector<float> a(static_cast<size_t>(n), 1.0f), b(static_cast<size_t>(n), 2.0f);
  ThreadPool& pool = pool_of(threads);
  std::vector<float> part(static_cast<size_t>(threads));
  for (auto _ : state) {
    pool.run(threads, [&](int t, int) {
      const int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
      part[t] = kernels::active().dot(a.data() + lo, b.data() + lo, hi - lo);
    });
    benchmark::DoNotOptimize(part.data());
  }
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2.0 * static_cast<double>(n) * 4.0 / 1e9,
      benchmark::Counter::kIsRate);
}

constexpr WeightFormat kB = WeightFormat::kBF16;
constexpr WeightFormat kQ = WeightFormat::kMXFP4;

void GemvBf16_12288x7168(benchmark::State& s) {
  run_matmul(s, kB, 12288, 7168, 1);
}
void GemvBf16_7168x12288(benchmark::State& s) {
  run_matmul(s, kB, 7168, 12288, 1);
}
// Kimi-Linear's BF16 rows of 2304 (4.5 KB): an expert's gate/up [1024 x 2304] and the KDA
// projections [4096 x 2304]; its decode spends most of its time in these one-row products.
void GemvBf16_1024x2304(benchmark::State& s) {
  run_matmul(s, kB, 1024, 2304, 1);
}
void GemvBf16_4096x2304(benchmark::State& s) {
  run_matmul(s, kB, 4096, 2304, 1);
}
void GemvMxfp4_3072x3584(benchmark::State& s) {
  run_matmul(s, kQ, 3072, 3584, 1);
}
void GemvMxfp4_3584x3072(benchmark::State& s) {
  run_matmul(s, kQ, 3584, 3072, 1);
}
// The same expert over and over (L3-resident): the decoder's own speed, without DRAM.
void GemvMxfp4_3072x3584_L3(benchmark::State& s) {
  run_matmul(s, kQ, 3072, 3584, 1, true);
}
void GemmBf16_12288x7168_M64(benchmark::State& s) {
  run_matmul(s, kB, 12288, 7168, 64);
}
void GemmBf16_7168x12288_M64(benchmark::State& s) {
  run_matmul(s, kB, 7168, 12288, 64);
}
void GemmMxfp4_3072x3584_M64(benchmark::State& s) {
  run_matmul(s, kQ, 3072, 3584, 64);
}
void GemmMxfp4_3584x3072_M64(benchmark::State& s) {
  run_matmul(s, kQ, 3584, 3072, 64);
}
void GemvBf16_4x12288x7168(benchmark::State& s) {
  run_matmul(s, kB, 12288, 7168, 4);
}
void GemvMxfp4_4x3072x3584(benchmark::State& s) {
  run_matmul(s, kQ, 3072, 3584, 4);
}
void MatmulTBf16_128x512_M1(benchmark::State& s) {
  run_matmul_t(s, 128, 512, 1);
}
void MatmulTBf16_128x512_M64(benchmark::State& s) {
  run_matmul_t(s, 128, 512, 64);
}

// Kimi K2 / DeepSeek-V3's quantised products at K2's shapes (hidden 7168, expert width 2048,
// dense width 18432), weights streamed from RAM (rotating over >= 160 MB of matrices), as a
// decoding pass reads them: GB/s of weight bytes (codes + scales) against MemoryBandwidth.
// Args: (format: 0 = FP8 E4M3 with 128x128 F32 block scales, 1 = INT4 pack-quantized with BF16
// group scales; shape: 0 = expert gate/up [2048 x 7168], 1 = expert down [7168 x 2048], 2 = dense
// gate/up [18432 x 7168], 3 = dense down [7168 x 18432]; M rows; threads).
void QuantProduct(benchmark::State& state) {
  const WeightFormat f = state.range(0) == 0 ? WeightFormat::kFP8 : WeightFormat::kInt4;
  static constexpr int64_t kShapes[4][2] = {
      {2048, 7168}, {7168, 2048}, {18432, 7168}, {7168, 18432}};
  const int64_t rows = kShapes[state.range(1)][0], cols = kShapes[state.range(1)][1];
  run_matmul(state, f, rows, cols, state.range(2), false, static_cast<int>(state.range(3)));
}

// The same decoders without DRAM: one K2 expert gate/up matrix [2048 x 7168] over and over (in
// L3), one thread. Args: (format as above; M).
void QuantProductL3(benchmark::State& state) {
  const WeightFormat f = state.range(0) == 0 ? WeightFormat::kFP8 : WeightFormat::kInt4;
  run_matmul(state, f, 2048, 7168, state.range(1), true, 1);
}

// The FMA peak of the active table on `threads` threads (kernels::fma_peak_flops): independent
// FMA chains without memory traffic, the yardstick of GEMM efficiency below.
double fma_peak(int threads) {
  static std::vector<double> peaks(65, 0.0);
  if (peaks[threads] == 0) peaks[threads] = kernels::fma_peak_flops(pool_of(threads), 0.2);
  return peaks[threads];
}

void FmaPeak(benchmark::State& state) {
  double peak = 0;
  for (auto _ : state) peak = kernels::fma_peak_flops(pool_of(static_cast<int>(state.range(0))));
  state.counters["GFLOP/s"] = peak / 1e9;
  state.SetLabel(kernels::active().name);
}

// Prefill GEMM efficiency: one expert-shaped product [3072 x 3584] (gate/up; the weights stay
// in L3 as they do while a pass applies an expert to its rows) at the row counts a routed
// expert gets in a pass (M = 4 .. 256), in % of the FMA peak on as many threads.
// Args: (format: 0 = BF16, 1 = MXFP4, 2 = F32; M; threads). F32 runs the BF16 tile without the
// widening (and with twice the weight bytes), which tells the decoder's share from the tile's.
void GemmEfficiency(benchmark::State& state) {
  const WeightFormat f = state.range(0) == 0 ? kB : state.range(0) == 1 ? kQ : WeightFormat::kF32;
  const int64_t M = state.range(1), rows = 3072, cols = 3584;
  const int threads = static_cast<int>(state.range(2));
  ThreadPool& pool = pool_of(threads);
  MatrixSet& set = matrices(f, rows, cols, /*hot=*/true);
  std::vector<float> x = activations(M * cols);
  std::vector<float> y(static_cast<size_t>(M * rows));
  for (auto _ : state) {
    kernels::matmul(set.items[0]->m, x.data(), M, cols, y.data(), rows, pool, false);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * static_cast<double>(M * rows * cols);
  state.counters["GFLOP/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * flops / 1e9, benchmark::Counter::kIsRate);
  state.counters["peak%"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * flops * 100.0 / fma_peak(threads),
      benchmark::Counter::kIsRate);
  state.SetLabel(kernels::active().name);
}

#define DF_BENCH(fn) \
  BENCHMARK(fn)->Arg(1)->Arg(2)->UseRealTime()->MinTime(1.0)->Unit(benchmark::kMillisecond)

BENCHMARK(FmaPeak)->Arg(1)->Arg(2)->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(GemmEfficiency)
    ->ArgsProduct({{0, 1, 2}, {4, 8, 16, 32, 64, 256}, {1, 2}})
    ->ArgNames({"format", "M", "threads"})
    ->UseRealTime()
    ->MinTime(0.5)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(QuantProduct)
    ->ArgsProduct({{0, 1}, {0, 1, 2, 3}, {1, 4, 8, 16}, {1, 2}})
    ->ArgNames({"format", "shape", "M", "threads"})
    ->UseRealTime()
    ->MinTime(0.5)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(QuantProductL3)
    ->ArgsProduct({{0, 1}, {1, 4, 8, 16}})
    ->ArgNames({"format", "M"})
    ->UseRealTime()
    ->MinTime(0.5)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(MemoryBandwidth)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(DotBandwidth)->Arg(1)->Arg(2)->UseRealTime()->MinTime(1.0)->Unit(benchmark::kMillisecond);
DF_BENCH(GemvBf16_12288x7168);
DF_BENCH(GemvBf16_7168x12288);
DF_BENCH(GemvBf16_1024x2304);
DF_BENCH(GemvBf16_4096x2304);
DF_BENCH(GemvMxfp4_3072x3584);
DF_BENCH(GemvMxfp4_3584x3072);
DF_BENCH(GemvMxfp4_3072x3584_L3);
DF_BENCH(GemvBf16_4x12288x7168);
DF_BENCH(GemvMxfp4_4x3072x3584);
DF_BENCH(GemmBf16_12288x7168_M64);
DF_BENCH(GemmBf16_7168x12288_M64);
DF_BENCH(GemmMxfp4_3072x3584_M64);
DF_BENCH(GemmMxfp4_3584x3072_M64);
DF_BENCH(MatmulTBf16_128x512_M1);
DF_BENCH(MatmulTBf16_128x512_M64);

}  // namespace
}  // namespace deltafin
