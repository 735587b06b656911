// deltafin_gpu_bench: the Vulkan kernels at K3 shapes (tools/gpu-check.sh runs it on a lent
// GPU). Not a Google Benchmark: each product is timed over a few repetitions after a warm-up,
// and its error is measured against a float64 reference on a sample of output elements, so one
// run says both how fast and how exact. The CPU's time for the same product (the active kernel
// table over all threads) is printed beside it.
//   deltafin_gpu_bench [--gpu auto|N] [--reps R] [--small]
// --small runs the same products at shapes a CPU driver (lavapipe) finishes in seconds.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "gpu/gpu.h"
#include "kernels/kernels.h"
#include "tensor/dtype.h"

using namespace deltafin;

namespace {

struct Weights {
  std::vector<uint8_t> data, scales;
  Matrix m;
};

Weights make(WeightFormat f, int64_t rows, int64_t cols, uint32_t seed) {
  Weights w;
  w.m.format = f;
  w.m.rows = rows;
  w.m.cols = cols;
  std::mt19937 rng(seed);
  w.data.resize(static_cast<size_t>(rows * w.m.row_bytes()));
  if (f == WeightFormat::kBF16) {
    std::normal_distribution<float> nd(0.0f, 0.05f);
    for (size_t i = 0; i + 1 < w.data.size(); i += 2) {
      uint16_t h = f32_to_bf16(nd(rng));
      std::memcpy(w.data.data() + i, &h, 2);
    }
  } else {
    for (auto& b : w.data) b = static_cast<uint8_t>(rng());
    w.scales.resize(static_cast<size_t>(rows * w.m.scale_row_bytes()));
    for (auto& s : w.scales) s = static_cast<uint8_t>(118 + rng() % 8);
    w.m.scales = w.scales.data();
  }
  w.m.data = w.data.data();
  return w;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// max |y - ref| / sum |terms| over `samples` random (m, n) elements.
double sampled_error(const Matrix& w, const float* x, int64_t M, int64_t K, const float* y,
                     int samples) {
  std::mt19937 rng(1);
  double worst = 0;
  for (int i = 0; i < samples; ++i) {
    const int64_t m = static_cast<int64_t>(rng() % static_cast<uint32_t>(M));
    const int64_t n = static_cast<int64_t>(rng() % static_cast<uint32_t>(w.rows));
    double ref = 0, mag = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double t = static_cast<double>(x[m * K + k]) * matrix_element(w, n, k);
      ref += t;
      mag += std::fabs(t);
    }
    worst = std::max(worst, std::fabs(y[m * w.rows + n] - ref) / std::max(mag, 1e-30));
  }
  return worst;
}

void report(const char* name, const Matrix& w, int64_t M, double gpu_s, double cpu_s, double err) {
  const double bytes = static_cast<double>(w.bytes());
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(w.rows * w.cols);
  std::printf(
      "%-22s %6lld x %-6lld M=%-5lld gpu %9.3f ms  %8.1f GB/s  %7.3f TFLOPS | cpu %9.3f ms | max "
      "rel err %.2e\n",
      name, static_cast<long long>(w.rows), static_cast<long long>(w.cols),
      static_cast<long long>(M), gpu_s * 1e3, bytes / gpu_s / 1e9, flops / gpu_s / 1e12,
      cpu_s * 1e3, err);
  std::fflush(stdout);
}

void product(gpu::Backend& g, const char* name, WeightFormat f, int64_t N, int64_t K, int64_t M,
             int reps, bool resident) {
  Weights w = make(f, N, K, static_cast<uint32_t>(N + K + M));
  std::vector<float> x(static_cast<size_t>(M * K)), y(static_cast<size_t>(M * N));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  if (resident && !g.make_resident(w.m))
    std::printf("%s: does not fit the device budget; uploaded per product\n", name);
  g.run(w.m, x.data(), M, K, y.data(), N, false);  // warm-up (pipelines, first upload)
  double t0 = now();
  for (int r = 0; r < reps; ++r) g.run(w.m, x.data(), M, K, y.data(), N, false);
  const double gpu_s = (now() - t0) / reps;
  const double err = sampled_error(w.m, x.data(), M, K, y.data(), 64);
  std::vector<float> yc(y.size());
  t0 = now();
  kernels::matmul(w.m, x.data(), M, K, yc.data(), N, global_pool());
  const double cpu_s = now() - t0;
  report(name, w.m, M, gpu_s, cpu_s, err);
}

void grouped(gpu::Backend& g, int64_t N, int64_t K, int experts, int64_t rows, int reps) {
  std::vector<Weights> ws;
  for (int e = 0; e < experts; ++e) ws.push_back(make(WeightFormat::kMXFP4, N, K, 100u + e));
  std::vector<float> x(static_cast<size_t>(rows * K));
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  // every row picks `top` experts round-robin: experts * rows_per_expert = rows * top
  const int top = std::min(experts, 8);
  std::vector<std::vector<int32_t>> rows_of(static_cast<size_t>(experts));
  for (int64_t r = 0; r < rows; ++r)
    for (int t = 0; t < top; ++t)
      rows_of[static_cast<size_t>((r * top + t) % experts)].push_back(static_cast<int32_t>(r));
  std::vector<gpu::Group> groups;
  int64_t total = 0;
  for (int e = 0; e < experts; ++e) {
    groups.push_back({ws[static_cast<size_t>(e)].m, rows_of[static_cast<size_t>(e)]});
    total += static_cast<int64_t>(rows_of[static_cast<size_t>(e)].size());
  }
  std::vector<float> y(static_cast<size_t>(total * N));
  g.run_grouped(groups, x.data(), K, y.data());
  const gpu::Stats s0 = g.stats();
  double t0 = now();
  for (int r = 0; r < reps; ++r) g.run_grouped(groups, x.data(), K, y.data());
  const double gpu_s = (now() - t0) / reps;
  const gpu::Stats s1 = g.stats();
  // error: expert 0's rows
  std::vector<float> x0;
  for (int32_t r : rows_of[0]) x0.insert(x0.end(), x.begin() + r * K, x.begin() + (r + 1) * K);
  const double err =
      sampled_error(ws[0].m, x0.data(), static_cast<int64_t>(rows_of[0].size()), K, y.data(), 64);
  Matrix all = ws[0].m;
  all.rows = N * experts;  // for the byte count of the report
  std::vector<float> yc(static_cast<size_t>(rows_of[0].size()) * static_cast<size_t>(N));
  t0 = now();
  for (int e = 0; e < experts; ++e) {
    const auto& rs = rows_of[static_cast<size_t>(e)];
    std::vector<float> xe;
    for (int32_t r : rs) xe.insert(xe.end(), x.begin() + r * K, x.begin() + (r + 1) * K);
    yc.resize(rs.size() * static_cast<size_t>(N));
    kernels::matmul(ws[static_cast<size_t>(e)].m, xe.data(), static_cast<int64_t>(rs.size()), K,
                    yc.data(), N, global_pool());
  }
  const double cpu_s = now() - t0;
  const double up = static_cast<double>(s1.expert_bytes - s0.expert_bytes);
  std::printf(
      "(grouped: %d MXFP4 experts, %lld rows x top-%d = %lld expert rows; %lld batches, %.1f MB "
      "of weights uploaded per product, %.0f%% of it while the device computed)\n",
      experts, static_cast<long long>(rows), top, static_cast<long long>(total),
      static_cast<long long>((s1.products - s0.products) / std::max(reps, 1)),
      up / 1e6 / std::max(reps, 1),
      up > 0 ? 100.0 * static_cast<double>(s1.overlapped_bytes - s0.overlapped_bytes) / up : 0.0);
  report("grouped MXFP4 GEMM", all, total / experts, gpu_s, cpu_s, err);
}

}  // namespace

int main(int argc, char** argv) {
  std::string select = "auto";
  int reps = 5;
  bool small = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--gpu" && i + 1 < argc) {
      select = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--small") {
      small = true;
    } else {
      std::fprintf(stderr, "usage: deltafin_gpu_bench [--gpu auto|N] [--reps R] [--small]\n");
      return 2;
    }
  }
  try {
    std::string line;
    gpu::Options o;
    o.select = select;
    o.min_rows = 1;
    auto g = gpu::Backend::open(o, line);
    std::fprintf(stderr, "%s\n", line.c_str());
    if (!g) return 3;
    const int64_t s = small ? 8 : 1;  // --small divides every dimension
    product(*g, "MXFP4 GEMV (expert)", WeightFormat::kMXFP4, 3072 / s, 3584 / s, 1, reps, true);
    product(*g, "BF16 GEMV (trunk)", WeightFormat::kBF16, 12288 / s, 7168 / s, 1, reps, true);
    product(*g, "BF16 GEMM T=2048", WeightFormat::kBF16, 3072 / s, 7168 / s, 2048 / s, reps, false);
    product(*g, "MXFP4 GEMM T=2048", WeightFormat::kMXFP4, 3072 / s, 3584 / s, 2048 / s, reps,
            false);
    grouped(*g, 3072 / s, 3584 / s, small ? 8 : 64, 2048 / s, reps);
    const gpu::Stats st = g->stats();
    std::printf("device: %s; %lld products, %.2f GB uploaded\n", g->info().describe().c_str(),
                static_cast<long long>(st.products), static_cast<double>(st.uploaded_bytes) / 1e9);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deltafin_gpu_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
