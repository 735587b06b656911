#include "doctor/forecast.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <vector>

#include "core/sysinfo.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "model/weights.h"
#include "storage/trunk_units.h"

namespace deltafin {

namespace {

// Deterministic filler: random mantissas with bounded exponents, so no product overflows,
// underflows into denormals or meets a NaN scale (any of which would time differently).
struct Fill {
  uint64_t x = 0x9E3779B97F4A7C15ull;
  uint64_t next() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  }
  void bf16(std::vector<uint16_t>& v) {
    for (auto& e : v) e = static_cast<uint16_t>(0x3C00u | (next() & 0x81FFu));
  }
  void bytes(std::vector<uint8_t>& v) {
    for (auto& e : v) e = static_cast<uint8_t>(next());
  }
  void scales(std::vector<uint8_t>& v, uint8_t base) {
    for (auto& e : v) e = static_cast<uint8_t>(base + (next() & 3u));
  }
  void f32(std::vector<float>& v) {
    for (auto& e : v) e = static_cast<float>(static_cast<int64_t>(next() % 2001) - 1000) * 1e-3f;
  }
};

// The median time of `fn` over repetitions lasting at least `min_s` in all (at least `reps`),
// after one warm-up run: the statistic `bench` reports (the median of whole runs). On a machine
// shared with other work, the best run would be the idle machine's speed and the mean would
// follow a moment's load spike; the median is the speed most of the runs got.
// A sanitizer build times one run (kSanitizedBuild).
double median_time(const std::function<void()>& fn, double min_s, size_t reps = 5) {
  if constexpr (kSanitizedBuild) {
    Stopwatch sw;
    fn();
    return std::max(sw.elapsed(), 1e-9);
  }
  fn();  // warm: page the buffers in, spin the pool up
  std::vector<double> times;
  double total = 0;
  while (times.size() < reps || (total < min_s && times.size() < 200)) {
    Stopwatch sw;
    fn();
    times.push_back(sw.elapsed());
    total += times.back();
  }
  std::nth_element(times.begin(), times.begin() + static_cast<long>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

// A matrix of `rows` x `cols` in a format, with the bytes it points into.
struct OwnedMatrix {
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> bytes, scales;
  std::vector<float> f32;
  Matrix m;
};

OwnedMatrix make_matrix(WeightFormat f, int64_t rows, int64_t cols, Fill& fill) {
  OwnedMatrix o;
  o.m.format = f;
  o.m.rows = rows;
  o.m.cols = cols;
  const auto n = static_cast<size_t>(rows * cols);
  switch (f) {
    case WeightFormat::kBF16:
      o.bf16.resize(n);
      fill.bf16(o.bf16);
      o.m.data = o.bf16.data();
      break;
    case WeightFormat::kMXFP4:
      o.bytes.resize(n / 2);
      o.scales.resize(n / 32);
      fill.bytes(o.bytes);
      fill.scales(o.scales, 120);
      o.m.data = o.bytes.data();
      o.m.scales = o.scales.data();
      break;
    case WeightFormat::kInt8:
      o.bytes.resize(n);
      o.scales.resize(static_cast<size_t>(rows) * 2);
      fill.bytes(o.bytes);
      for (size_t r = 0; r < o.scales.size(); r += 2) {  // f16 scale 2^-7
        o.scales[r] = 0x00;
        o.scales[r + 1] = 0x20;
      }
      o.m.data = o.bytes.data();
      o.m.scales = o.scales.data();
      break;
    case WeightFormat::kF32:
      o.f32.resize(n);
      fill.f32(o.f32);
      o.m.data = o.f32.data();
      break;
    case WeightFormat::kFP8:  // E4M3 codes of exponent 4..11 (no subnormal, no NaN)
    case WeightFormat::kInt4:
      o.bytes.resize(static_cast<size_t>(rows * o.m.row_bytes()));
      fill.bytes(o.bytes);
      if (f == WeightFormat::kFP8) {
        for (auto& b : o.bytes) b = static_cast<uint8_t>((b & 0x87u) | (0x20u + (b & 0x38u)));
      }
      o.scales.resize(static_cast<size_t>(o.m.scale_bytes()));
      for (size_t i = 0; i < o.scales.size(); i += f == WeightFormat::kFP8 ? 4 : 2) {
        if (f == WeightFormat::kFP8) {
          const float s = 1.0f / 512;  // F32 block scales
          std::memcpy(&o.scales[i], &s, 4);
        } else {  // BF16 group scales 2^-7
          o.scales[i] = 0x00;
          o.scales[i + 1] = 0x3C;
        }
      }
      o.m.data = o.bytes.data();
      o.m.scales = o.scales.data();
      break;
  }
  return o;
}

// Weight bytes per second of one-row products over `mats` (together larger than the caches).
double gemv_rate(const std::vector<OwnedMatrix>& mats, ThreadPool& pool) {
  int64_t cols = 0, rows = 0;
  double bytes = 0;
  for (const auto& o : mats) {
    cols = std::max(cols, o.m.cols);
    rows = std::max(rows, o.m.rows);
    bytes += static_cast<double>(o.m.bytes());
  }
  std::vector<float> x(static_cast<size_t>(cols), 0.01f), y(static_cast<size_t>(rows));
  const double t = median_time(
      [&] {
        for (const auto& o : mats)
          kernels::matmul(o.m, x.data(), 1, o.m.cols, y.data(), rows, pool);
      },
      0.4);
  return bytes / t;
}

// FLOP/s of products with `M` rows of x over `mats`.
double gemm_rate(const std::vector<OwnedMatrix>& mats, int64_t M, ThreadPool& pool,
                 double min_s = 0.1, size_t reps = 5) {
  int64_t cols = 0, rows = 0;
  double flops = 0;
  for (const auto& o : mats) {
    cols = std::max(cols, o.m.cols);
    rows = std::max(rows, o.m.rows);
    flops += 2.0 * static_cast<double>(M * o.m.rows * o.m.cols);
  }
  std::vector<float> x(static_cast<size_t>(M * cols), 0.01f), y(static_cast<size_t>(M * rows));
  const double t = median_time(
      [&] {
        for (const auto& o : mats) kernels::matmul(o.m, x.data(), M, cols, y.data(), rows, pool);
      },
      min_s, reps);
  return flops / t;
}

bool is_product(const TensorInfo& t) {
  return t.shape.size() == 2 && t.shape[0] > 1;
}

// The distinct shapes (rows, cols) of the layers' BF16 trunk products, with how many of each
// the model has: what a prefill pass multiplies its block of rows with (the LM head is left
// out: it runs on the pass's last row only).
using Shapes = std::map<std::pair<int64_t, int64_t>, int>;
Shapes trunk_product_shapes(const ModelConfig& c, const TensorTable& tensors) {
  Shapes shapes;
  for (int i = 0; i < static_cast<int>(c.num_layers); ++i)
    for (const auto& n : layer_trunk_tensors(c, i, tensors)) {
      const TensorInfo& t = tensors.at(n);
      if (is_product(t) && t.dtype == DType::kBF16) ++shapes[{t.shape[0], t.shape[1]}];
    }
  return shapes;
}

// FLOP/s of the trunk's own products in format `f` with `M` rows of x: each distinct shape
// timed on its first rows (at most 8 MB of weights; the kernel blocks over rows, so a cut keeps
// its blocking over the columns), and the model's mix of them: all its FLOPs over the time they
// take. The kernel's speed depends on the shape (a 12288-column product runs ~15% slower than
// a 7168-column one at two threads here), so one reference shape would misjudge the mix.
double trunk_gemm_rate(WeightFormat f, const Shapes& shapes, int64_t M, Fill& fill,
                       ThreadPool& pool) {
  double flops = 0, seconds = 0;
  for (const auto& [shape, count] : shapes) {
    const int64_t rows = shape.first, cols = shape.second;
    const int64_t per_weight = f == WeightFormat::kInt8 ? 1 : 2;
    const int64_t cut = std::clamp<int64_t>((8ll << 20) / (per_weight * cols) / 16 * 16, 16, rows);
    std::vector<OwnedMatrix> m;
    m.push_back(make_matrix(f, cut, cols, fill));
    const double rate = gemm_rate(m, M, pool, 0.03, 3);
    const double all = 2.0 * static_cast<double>(M * rows * cols) * count;
    flops += all;
    seconds += all / std::max(rate, 1.0);
  }
  return seconds > 0 ? flops / seconds : 0;
}

// The format a trunk matrix computes in under the plan (int8 only where resident and lossy).
WeightFormat trunk_format(const TensorInfo& t, bool resident_int8) {
  if (t.dtype == DType::kBF16) return resident_int8 ? WeightFormat::kInt8 : WeightFormat::kBF16;
  return t.dtype == DType::kF32 ? WeightFormat::kF32 : WeightFormat::kBF16;
}

struct Unit {
  double bytes = 0;      // as computed with
  double flops_row = 0;  // 2 * weights per row
  double products = 0;
  double bf16_bytes = 0, int8_bytes = 0, f32_bytes = 0;
};

Unit unit_of(const TensorTable& tensors, const std::vector<std::string>& names, bool int8) {
  Unit u;
  for (const auto& n : names) {
    const TensorInfo& t = tensors.at(n);
    if (!is_product(t) || n.ends_with("model.embed_tokens.weight")) continue;
    const WeightFormat f = trunk_format(t, int8);
    const double b = f == WeightFormat::kInt8
                         ? static_cast<double>(int8_bytes(t.shape[0], t.shape[1]))
                         : static_cast<double>(t.nbytes);
    (f == WeightFormat::kInt8  ? u.int8_bytes
     : f == WeightFormat::kF32 ? u.f32_bytes
                               : u.bf16_bytes) += b;
    u.bytes += b;
    u.flops_row += 2.0 * static_cast<double>(t.numel());
    u.products += 1;
  }
  return u;
}

}  // namespace

double experts_touched(const ModelConfig& c, int64_t rows) {
  const double E = static_cast<double>(c.moe.num_experts), k = static_cast<double>(c.moe.top_k);
  if (E <= 0 || k <= 0) return 0;
  return E * (1.0 - std::pow(1.0 - k / E, static_cast<double>(rows)));
}

int64_t rows_per_expert(const ModelConfig& c, int64_t rows) {
  const double u = experts_touched(c, rows);
  if (u <= 0) return 1;
  return std::max<int64_t>(
      1, std::llround(static_cast<double>(rows) * static_cast<double>(c.moe.top_k) / u));
}

double expert_seconds(const KernelSpeeds& s, double n) {
  const auto& t = s.expert_row_seconds;
  if (t.empty()) return 0;
  const auto block = static_cast<double>(std::max<int64_t>(1, s.block_rows));
  if (n > block) {  // the expert runs its rows a block at a time
    const double full = std::floor(n / block), rest = n - full * block;
    return full * expert_seconds(s, block) + (rest > 0 ? expert_seconds(s, rest) : 0.0);
  }
  if (t.size() == 1) return t[0].second * n / static_cast<double>(t[0].first);
  size_t i = 1;  // the segment [t[i-1], t[i]] holding n, or the last one (extended past it)
  while (i + 1 < t.size() && static_cast<double>(t[i].first) < n) ++i;
  const double n0 = static_cast<double>(t[i - 1].first), n1 = static_cast<double>(t[i].first);
  return std::max(0.0, t[i - 1].second + (t[i].second - t[i - 1].second) * (n - n0) / (n1 - n0));
}

double expected_expert_seconds(const ModelConfig& c, const KernelSpeeds& s, int64_t rows) {
  const double E = static_cast<double>(c.moe.num_experts);
  const double p = std::min(1.0, static_cast<double>(c.moe.top_k) / std::max(E, 1.0));
  if (p >= 1.0) return E * expert_seconds(s, static_cast<double>(rows));
  const double R = static_cast<double>(rows);
  double sum = 0;
  for (int64_t n = 1; n <= rows; ++n) {
    const double k = static_cast<double>(n);
    const double log_pmf = std::lgamma(R + 1) - std::lgamma(k + 1) - std::lgamma(R - k + 1) +
                           k * std::log(p) + (R - k) * std::log1p(-p);
    const double pmf = std::exp(log_pmf);
    if (pmf > 1e-12) sum += pmf * expert_seconds(s, k);
  }
  return E * sum;
}

KernelSpeeds measure_kernel_speeds(const ModelConfig& c, const TensorTable& tensors,
                                   int64_t pass_rows, int64_t block_rows, ThreadPool& pool) {
  Stopwatch total;
  KernelSpeeds s;
  s.pass_rows = std::max<int64_t>(1, pass_rows);
  s.block_rows = std::max<int64_t>(1, block_rows);
  s.trunk_rows = std::min(s.pass_rows, s.block_rows);
  s.expert_rows = std::min(rows_per_expert(c, s.pass_rows), s.block_rows);
  Fill fill;
  const int64_t H = c.hidden;
  // Decode: a trunk-sized matrix of ~176 MB at K3's width (more than any last-level cache).
  const int64_t rows = std::max<int64_t>(16, (176ll << 20) / 2 / H / 16 * 16);
  {
    std::vector<OwnedMatrix> m;
    m.push_back(make_matrix(WeightFormat::kBF16, rows, H, fill));
    s.bf16_gemv = gemv_rate(m, pool);
    // One small in-cache product: what a product costs beyond its arithmetic.
    m[0].m.rows = 64;
    std::vector<float> x(static_cast<size_t>(H), 0.01f), y(64);
    s.product_overhead_s =
        median_time([&] { kernels::matmul(m[0].m, x.data(), 1, H, y.data(), 64, pool); }, 0.02);
  }
  {
    std::vector<OwnedMatrix> m;
    m.push_back(make_matrix(WeightFormat::kInt8, rows, H, fill));
    s.int8_gemv = gemv_rate(m, pool);
  }
  // Prefill: the trunk's products at their own shapes with trunk_rows rows of x.
  const Shapes shapes = trunk_product_shapes(c, tensors);
  s.trunk_shapes = static_cast<int>(shapes.size());
  s.bf16_gemm = trunk_gemm_rate(WeightFormat::kBF16, shapes, s.trunk_rows, fill, pool);
  s.int8_gemm = trunk_gemm_rate(WeightFormat::kInt8, shapes, s.trunk_rows, fill, pool);
  {
    // Attention-side f32 products (latent scores, KDA chunks) at their width.
    std::vector<OwnedMatrix> m;
    m.push_back(
        make_matrix(WeightFormat::kF32, 1024, std::max<int64_t>(64, c.mla.cache_width()), fill));
    s.f32_gemm = gemm_rate(m, std::min<int64_t>(s.trunk_rows, 32), pool);
  }
  if (c.moe.num_experts > 0 && c.moe.intermediate > 0 && c.expert_dim() > 0) {
    // Routed experts: gate, up [I, D] and down [D, I] in their format (K3: MXFP4; Kimi K2: FP8;
    // K2-Thinking: INT4; Kimi-Linear: BF16; mxfp4_gemv / mxfp4_gemm name K3's), as many experts
    // as make ~150 MB.
    const int64_t I = c.moe.intermediate, D = c.expert_dim();
    const ExpertFormat xf = c.expert_format();
    const WeightFormat ef = xf == ExpertFormat::kFP8    ? WeightFormat::kFP8
                            : xf == ExpertFormat::kInt4 ? WeightFormat::kInt4
                            : xf == ExpertFormat::kBF16 ? WeightFormat::kBF16
                                                        : WeightFormat::kMXFP4;
    const double expert = 3.0 * static_cast<double>(I * D) * (0.5 + 1.0 / 32);
    const int n = static_cast<int>(std::clamp(150e6 / expert, 2.0, 64.0));
    std::vector<OwnedMatrix> m;
    for (int e = 0; e < n; ++e) {
      m.push_back(make_matrix(ef, I, D, fill));
      m.push_back(make_matrix(ef, I, D, fill));
      m.push_back(make_matrix(ef, D, I, fill));
    }
    s.mxfp4_gemv = gemv_rate(m, pool);
    // Prefill: one expert's three products with n rows, at the row counts a pass of
    // `pass_rows` rows gives an expert under uniform routing (Binomial(rows, k/E): its bulk,
    // mean +- 3 sd, and one row; an expert takes its rows a block at a time): the kernel's cost
    // is not proportional to the rows (a few rows take the GEMV path, more the GEMM; both have
    // a per-product cost), so the forecast sums it over the distribution rather than taking
    // the mean's rate.
    m.resize(3);
    const double R = static_cast<double>(s.pass_rows);
    const double p =
        std::min(1.0, static_cast<double>(c.moe.top_k) / static_cast<double>(c.moe.num_experts));
    const double mean = R * p, sd = std::sqrt(R * p * (1 - p));
    const auto lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(mean - 3 * sd)));
    const auto hi =
        std::max(lo, std::min(s.block_rows, static_cast<int64_t>(std::ceil(mean + 3 * sd))));
    std::vector<int64_t> ns{1};
    constexpr int64_t kPoints = 8;
    for (int64_t i = 0; i < kPoints; ++i) {
      const int64_t n = lo + (hi - lo) * i / (kPoints - 1);
      if (n > ns.back()) ns.push_back(n);
    }
    for (const int64_t n : ns) {
      const double flops = 2.0 * static_cast<double>(n) * 3 * static_cast<double>(I * D);
      s.expert_row_seconds.emplace_back(n, flops / gemm_rate(m, n, pool, 0.03, 3));
    }
    const double at = static_cast<double>(s.expert_rows);
    s.mxfp4_gemm = 6.0 * at * static_cast<double>(I * D) / expert_seconds(s, at);
  }
  s.memory_bandwidth = measure_memory_bandwidth(pool.size());
  s.fma_peak = kernels::fma_peak_flops(pool);
  s.seconds = total.elapsed();
  return s;
}

double lru_hit_rate(const ModelConfig& c, const MemoryPlan& plan, int64_t rows) {
  if (plan.all_experts_bytes == 0 || plan.expert_cache_bytes >= plan.all_experts_bytes) return 1.0;
  if (plan.expert_slot_bytes == 0) return 0.0;
  const double cache = static_cast<double>(plan.expert_cache_bytes / plan.expert_slot_bytes);
  const double E = static_cast<double>(c.moe.num_experts), k = static_cast<double>(c.moe.top_k);
  const double layers = static_cast<double>(c.num_moe_layers());
  const double miss_one = std::pow(1.0 - k / E, static_cast<double>(rows));  // not used in a pass
  // An expert used in a pass comes back d passes later with probability (1 - m) m^(d-1); LRU
  // still holds it if the experts all layers touched in those d passes fit in the cache.
  int64_t fits = 0;
  while (fits < 1000000 &&
         layers * E * (1.0 - std::pow(miss_one, static_cast<double>(fits + 1))) <= cache)
    ++fits;
  return 1.0 - std::pow(miss_one, static_cast<double>(fits));
}

namespace {

// The disk as two flows sharing its bandwidth: the trunk streamer's one read ahead, and the
// expert store's reads of a layer's misses (each pool has its own readers). A home drive
// (`place --home`) adds its bandwidth to the expert flow only: homes hold routed experts, the
// trunk streams from the model's own drive.
class DiskTimeline {
 public:
  DiskTimeline(double bw, double home_bw) : bw_(bw), home_bw_(home_bw) {}
  // Moves the clock to `t`, progressing the flows in flight.
  void advance(double t) {
    while (now_ < t && (trunk_left_ > 0 || expert_left_ > 0))
      step(std::min(first_done(), t - now_));
    now_ = std::max(now_, t);
  }
  void read_trunk(int unit, double bytes) {
    if (trunk_unit_ == unit || ready_unit_ == unit) return;
    trunk_unit_ = unit;
    trunk_left_ = std::max(bytes, 1.0);
  }
  // When the trunk read of `unit` completes (it must be in flight or done).
  double trunk_ready(int unit) {
    while (ready_unit_ != unit && trunk_left_ > 0) step(first_done());
    return ready_at_;
  }
  double read_experts(double bytes) {
    expert_left_ = std::max(bytes, 1.0);
    while (expert_left_ > 0) step(first_done());
    return expert_done_;
  }
  double now() const { return now_; }

 private:
  // The model's drive is shared evenly by the flows in flight; the home serves experts only.
  double share() const { return bw_ / std::max((trunk_left_ > 0) + (expert_left_ > 0), 1); }
  double expert_rate() const { return share() + home_bw_; }
  // Seconds until the first flow in flight completes.
  double first_done() const {
    double first = 1e300;
    if (trunk_left_ > 0) first = std::min(first, trunk_left_ / share());
    if (expert_left_ > 0) first = std::min(first, expert_left_ / expert_rate());
    return first;
  }
  void step(double dt) {
    const double trunk_rate = share(), experts_rate = expert_rate();
    now_ += dt;
    if (trunk_left_ > 0 && (trunk_left_ -= dt * trunk_rate) <= 1e-6) {
      trunk_left_ = 0;
      ready_unit_ = trunk_unit_;
      ready_at_ = now_;
      trunk_unit_ = -1;
    }
    if (expert_left_ > 0 && (expert_left_ -= dt * experts_rate) <= 1e-6) {
      expert_left_ = 0;
      expert_done_ = now_;
    }
  }
  double bw_, home_bw_, now_ = 0;
  double trunk_left_ = 0, expert_left_ = 0, ready_at_ = 0, expert_done_ = 0;
  int trunk_unit_ = -1, ready_unit_ = -1;
};

}  // namespace

Forecast forecast(const ModelConfig& c, const TensorTable& tensors, const MemoryPlan& plan,
                  const KernelSpeeds& s, double disk_bw, int64_t prompt_tokens,
                  const DraftAssumption* draft, double home_bw) {
  Forecast f;
  const int L = static_cast<int>(c.num_layers);
  const bool int8 = plan.trunk == TrunkFormat::kInt8;
  std::vector<Unit> units;
  std::vector<bool> streamed;
  for (int i = 0; i <= L; ++i) {
    const bool res =
        i < static_cast<int>(plan.resident.size()) && plan.resident[static_cast<size_t>(i)];
    streamed.push_back(!res);
    units.push_back(unit_of(tensors, i < L ? layer_trunk_tensors(c, i, tensors) : head_tensors(c),
                            int8 && res));
  }
  const double slot = static_cast<double>(plan.expert_slot_bytes);
  // An expert's weight bytes and FLOPs per row (gate, up and down).
  const double expert_bytes =
      3.0 * static_cast<double>(c.moe.intermediate * c.expert_dim()) * (0.5 + 1.0 / 32);
  const double kda_state =
      static_cast<double>(c.kda.num_heads * c.kda.head_dim * c.kda.head_dim) * 4;
  const double mem = std::max(s.memory_bandwidth, 1.0);
  const double disk = std::max(disk_bw, 1.0), home = std::max(home_bw, 0.0);
  auto rate = [](double r) { return std::max(r, 1.0); };
  auto next_streamed = [&](int u) {
    for (int k = 1; k <= L + 1; ++k) {
      const int v = (u + k) % (L + 1);
      if (streamed[static_cast<size_t>(v)]) return v;
    }
    return -1;
  };

  // One pass of `rows` rows whose first position is `pos`; `decode`: one-row products (GEMV).
  // The timeline of the engine: a streamed unit waits for its read, and acquiring it starts the
  // read of the next streamed unit; a MoE layer's misses are read once its router has run, and
  // its experts compute as they arrive. Two passes run, so the read-ahead across the pass
  // boundary is in steady state; the second one is the forecast.
  auto pass = [&](int64_t rows, int64_t pos, bool decode, double hit) {
    PassCost p;
    const double r = static_cast<double>(rows);
    const double u = experts_touched(c, rows);
    const double blocks = decode ? 1.0 : std::ceil(r / static_cast<double>(plan.pass.block_rows));
    const double prefill_experts = decode ? 0.0 : expected_expert_seconds(c, s, rows);
    DiskTimeline io(disk, home);
    double t = 0, second_start = 0;
    for (int round = 0; round < 2; ++round) {
      if (round == 1) second_start = t;
      for (int i = 0; i <= L; ++i) {
        const Unit& tu = units[static_cast<size_t>(i)];
        const bool head = i == L;
        double trunk;
        if (decode || head) {  // the head runs on the pass's last row only
          trunk = tu.bf16_bytes / rate(s.bf16_gemv) + tu.int8_bytes / rate(s.int8_gemv) +
                  tu.f32_bytes / rate(s.bf16_gemv);
        } else {
          const double share_int8 = tu.bytes > 0 ? tu.int8_bytes / tu.bytes : 0;
          trunk = tu.flops_row * r *
                  ((1 - share_int8) / rate(s.bf16_gemm) + share_int8 / rate(s.int8_gemm));
        }
        trunk += tu.products * blocks * s.product_overhead_s;
        double other = 0, experts = 0, missed = 0;
        if (!head) {
          const double avg_pos = static_cast<double>(pos) + (r + 1) / 2;
          if (c.is_mla(i)) {
            const double width = static_cast<double>(c.mla.cache_width() + c.mla.kv_lora_rank);
            other =
                static_cast<double>(c.mla.num_heads) * r * avg_pos * width * 2 / rate(s.f32_gemm) +
                avg_pos * static_cast<double>(c.mla.cache_width()) * 4 / mem;
          } else {
            other = static_cast<double>(c.kda.num_heads) * r * 8 *
                        static_cast<double>(c.kda.head_dim * c.kda.head_dim) / rate(s.f32_gemm) +
                    2 * kda_state / mem;
          }
          if (!c.is_dense(i)) {
            // Decode reads each of its experts once (one-row products, bound by memory); in a
            // prefill pass each expert gets Binomial(rows, k/E) rows, at their measured cost
            // (which includes each product's fork and join).
            experts = decode ? u * expert_bytes / rate(s.mxfp4_gemv) + 3 * u * s.product_overhead_s
                             : prefill_experts;
            missed = u * (1 - hit) * slot;
          }
        }
        // Acquire the unit: wait for its read, and start reading the next streamed one.
        if (streamed[static_cast<size_t>(i)]) {
          io.advance(t);
          io.read_trunk(i, static_cast<double>(plan.unit_file_bytes[static_cast<size_t>(i)]));
          t = std::max(t, io.trunk_ready(i));
          const int n = next_streamed(i);
          io.advance(t);
          if (n >= 0 && n != i)
            io.read_trunk(n, static_cast<double>(plan.unit_file_bytes[static_cast<size_t>(n)]));
        }
        t += trunk + other;
        if (missed > 0) {
          io.advance(t);
          const double arrived = io.read_experts(missed);
          t = std::max(t + experts, arrived + experts / std::max(u, 1.0));
        } else {
          t += experts;
        }
        if (round == 1) {
          p.compute_s += trunk + other + experts;
          p.touched_bytes += tu.bytes + (c.is_dense(i) || head ? 0 : u * expert_bytes);
          const double unit_read =
              streamed[static_cast<size_t>(i)]
                  ? static_cast<double>(plan.unit_file_bytes[static_cast<size_t>(i)])
                  : 0;
          p.read_bytes += missed + unit_read;
          p.read_s += unit_read / disk + missed / (disk + home);
          if (!c.is_dense(i) && !head) p.experts += u;
        }
      }
    }
    p.seconds = t - second_start;
    return p;
  };

  // Decode: one token after the prompt.
  f.expert_hit_rate = lru_hit_rate(c, plan, 1);
  f.decode = pass(1, prompt_tokens, true, f.expert_hit_rate);
  f.decode_s_per_token = f.decode.seconds;
  f.bound = f.decode.read_s >= f.decode.compute_s ? "disk" : "compute";
  // Prefill: the prompt in passes of the plan's rows.
  const int64_t per_pass = std::max<int64_t>(1, plan.pass.pass_rows);
  const double prefill_hit = lru_hit_rate(c, plan, std::min(per_pass, prompt_tokens));
  for (int64_t b = 0; b < prompt_tokens; b += per_pass) {
    const PassCost p = pass(std::min(per_pass, prompt_tokens - b), b, false, prefill_hit);
    f.prefill.seconds += p.seconds;
    f.prefill.compute_s += p.compute_s;
    f.prefill.read_s += p.read_s;
    f.prefill.read_bytes += p.read_bytes;
    f.prefill.touched_bytes += p.touched_bytes;
    f.prefill.experts += p.experts;
    ++f.prefill_passes;
  }
  f.prefill_tokens_per_s =
      f.prefill.seconds > 0 ? static_cast<double>(prompt_tokens) / f.prefill.seconds : 0;
  if (draft != nullptr && draft->drafts > 0) {
    const int64_t rows = 1 + draft->drafts;
    f.verify = pass(rows, prompt_tokens, true, lru_hit_rate(c, plan, rows));
    const double steps = static_cast<double>(draft->drafts) *
                         static_cast<double>(draft->weight_bytes) / rate(s.bf16_gemv);
    f.draft_s_per_token = (f.verify.seconds + steps) / std::max(draft->tokens_per_pass, 1.0);
  }
  return f;
}

}  // namespace deltafin
