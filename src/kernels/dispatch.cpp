// Picks the kernel table for this CPU and provides the threaded front ends.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/sysinfo.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "kernels/offload.h"

namespace deltafin::kernels {

namespace {
std::atomic<const KernelTable*> g_active{nullptr};
thread_local MatmulOffload* t_offload = nullptr;

const KernelTable* by_name(const std::string& n) {
  if (n == "scalar") return &scalar_table();
  if (n == "avx2") return avx2_table();
  if (n == "avx512") return avx512_table();
  if (n == "neon") return neon_table();
  return nullptr;
}

const KernelTable* best() {
  if (const char* env = std::getenv("DELTAFIN_KERNELS"); env != nullptr && *env != '\0') {
    const KernelTable* t = by_name(env);
    if (t == nullptr) {
      fail(
          "DELTAFIN_KERNELS={} is not available on this machine (expected scalar, avx2, avx512 "
          "or neon, as the CPU supports)",
          env);
    }
    return t;
  }
  if (auto* t = avx512_table()) return t;
  if (auto* t = avx2_table()) return t;
  if (auto* t = neon_table()) return t;
  return &scalar_table();
}
}  // namespace

// The CPU checks live here, in code compiled for the baseline ISA: the ISA files are compiled
// with their own flags and may use those instructions anywhere, even in a one-line function.
#if defined(DELTAFIN_HAVE_X86)
const KernelTable* avx2_table() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c ? &avx2_kernels() : nullptr;
}
const KernelTable* avx512_table() {
  const CpuFeatures& f = cpu_features();
  // avx512.cpp is compiled for F+BW+VL+DQ (+FMA, F16C); all must be there and OS-enabled
  // (__builtin_cpu_supports checks XCR0).
  return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c ? &avx512_kernels()
                                                                                : nullptr;
}
#else
const KernelTable* avx2_table() {
  return nullptr;
}
const KernelTable* avx512_table() {
  return nullptr;
}
#endif
#if defined(DELTAFIN_HAVE_NEON)
const KernelTable* neon_table() {
  return cpu_features().neon ? &neon_kernels() : nullptr;
}
#else
const KernelTable* neon_table() {
  return nullptr;
}
#endif

const KernelTable& active() {
  const KernelTable* t = g_active.load(std::memory_order_acquire);
  if (t == nullptr) {
    t = best();
    g_active.store(t, std::memory_order_release);
  }
  return *t;
}

// The sets this CPU can run, for error messages ("scalar, avx2").
std::string available_sets() {
  std::string out;
  for (const char* n : {"scalar", "avx2", "avx512", "neon"}) {
    if (by_name(n) != nullptr) out += (out.empty() ? "" : ", ") + std::string(n);
  }
  return out;
}

void select(const char* name) {
  const std::string n = name;
  if (n != "scalar" && n != "avx2" && n != "avx512" && n != "neon") {
    fail_arg(
        "kernel set '{}' is unknown (expected scalar, avx2, avx512 or neon; this machine runs {})",
        n, available_sets());
  }
  const KernelTable* t = by_name(n);
  if (t == nullptr)
    fail("kernel set '{}' is not available on this machine (it runs {})", n, available_sets());
  g_active.store(t, std::memory_order_release);
}

// Finer tasks than threads keep threads busy when one starts late; results do not depend on
// the split (each output row is computed whole by one call).
constexpr int kTasksPerThread = 4;

OffloadScope::OffloadScope(MatmulOffload* offload) : previous_(t_offload) {
  t_offload = offload;
}
OffloadScope::~OffloadScope() {
  t_offload = previous_;
}
MatmulOffload* current_offload() {
  return t_offload;
}

void matmul(const Matrix& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy,
            ThreadPool& pool, bool accumulate) {
  if (t_offload != nullptr && t_offload->matmul(w, x, M, ldx, y, ldy, accumulate)) return;
  const KernelTable& t = active();
  MatmulFn fn = t.matmul[static_cast<int>(w.format)];
  // Aim for >= ~64K multiply-adds per task so short products do not pay for a fork.
  int64_t per_row = std::max<int64_t>(1, w.cols * M);
  int64_t grain = std::max<int64_t>(16, (int64_t{1} << 16) / per_row);
  pool.parallel_for(
      w.rows, grain, [&](int64_t b, int64_t e, int) { fn(w, b, e, x, M, ldx, y, ldy, accumulate); },
      16, kTasksPerThread);
}

double fma_peak_flops(ThreadPool& pool, double seconds) {
  const KernelTable& t = active();
  // Calibrate one thread's rounds to about `seconds`, then run them on every thread at once.
  int64_t iters = int64_t{1} << 14;
  std::atomic<float> sink{0};
  for (;;) {
    Stopwatch sw;
    sink = sink + t.fma_loop(iters);
    if (sw.elapsed() > seconds / 4 || iters > (int64_t{1} << 34)) {
      iters =
          static_cast<int64_t>(static_cast<double>(iters) * seconds / std::max(sw.elapsed(), 1e-6));
      break;
    }
    iters *= 4;
  }
  iters = std::max<int64_t>(iters, 1);
  const int n = pool.size();
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    Stopwatch sw;
    pool.run(n, [&](int, int) { sink = sink + t.fma_loop(iters); });
    const double el = sw.elapsed();
    if (el > 0)
      best = std::max(best,
                      static_cast<double>(n) * static_cast<double>(iters) * t.fma_loop_flops / el);
  }
  return sink.load() == 12345.678f ? best + 1 : best;  // keeps the loops observable
}

MatmulTFn matmul_t_fn(WeightFormat f) {
  MatmulTFn fn = active().matmul_t[static_cast<int>(f)];
  return fn != nullptr ? fn : scalar_table().matmul_t[static_cast<int>(f)];
}

MatmulFn matmul_fn(WeightFormat f) {
  return active().matmul[static_cast<int>(f)];
}

void matmul_t(const Matrix& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy,
              ThreadPool& pool) {
  MatmulTFn fn = matmul_t_fn(w.format);
  int64_t per_col = std::max<int64_t>(1, w.rows * M);
  int64_t grain = std::max<int64_t>(16, (int64_t{1} << 16) / per_col);
  pool.parallel_for(
      w.cols, grain, [&](int64_t b, int64_t e, int) { fn(w, b, e, x, M, ldx, y, ldy); }, 16);
}

}  // namespace deltafin::kernels
