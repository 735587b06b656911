// Dense SiTU MLP (layer 0 and the shared experts) and the latent MoE with its router
// (docs/MODEL.md §3.7–3.8). Routing is per row; then every selected expert is fetched once per
// pass and applied to all the rows that chose it, whichever sequences (and blocks of a long
// pass, pass_plan.h) they belong to, as experts become ready. Each row's expert outputs are summed
// in ascending expert-id order, so the result does not depend on arrival order, batching or thread
// count. When the pass's offload takes grouped products (the GPU in a prefill pass), experts are
// gathered in windows as they arrive and each window runs as two grouped products on the device
// — gate and up of all its experts over their rows, then down — with SiTU between them on the
// CPU (the same ops::situ_rows): each expert's weights go to the device once per pass, and a
// window the device declines runs on the CPU as without it.
#include <algorithm>
#include <numeric>

#include "core/thread_pool.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "kernels/offload.h"
#include "model/layers.h"
#include "model/ops.h"

namespace deltafin {
namespace {

// ops::situ_rows split over the pool: element-wise, so exactly the serial result. Run serially
// it was ~4% of a one-thread prefill (two tanh and an exp per element) and twice that share
// on two threads, where it held the other thread idle.
void situ_parallel(ThreadPool& pool, const float* g, const float* u, int64_t n, float beta,
                   float lbeta, float* out) {
  pool.parallel_for(n, 4096, [&](int64_t b, int64_t e, int) {
    ops::situ_rows(g + b, u + b, e - b, beta, lbeta, out + b);
  });
}

}  // namespace

void mlp_forward(const LayerContext& ctx, const MlpWeights& w, const float* x, float* y,
                 bool accumulate) {
  const int64_t R = ctx.rows, H = ctx.c.hidden, I = w.gate.rows;
  std::vector<float> g(static_cast<size_t>(R * I)), u(static_cast<size_t>(R * I));
  kernels::matmul(w.gate, x, R, H, g.data(), I, ctx.pool);
  kernels::matmul(w.up, x, R, H, u.data(), I, ctx.pool);
  situ_parallel(ctx.pool, g.data(), u.data(), R * I, ctx.c.situ_beta, ctx.c.situ_linear_beta,
                g.data());
  kernels::matmul(w.down, g.data(), R, I, y, H, ctx.pool, accumulate);
}

void route_row(const float* logits, const float* bias, int64_t E, int64_t top_k, bool renormalize,
               float scaling, int* ids, float* weights) {
  thread_local std::vector<int> order;
  thread_local std::vector<float> score, choice;
  order.resize(static_cast<size_t>(E));
  score.resize(static_cast<size_t>(E));
  choice.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    score[e] = ops::sigmoid(logits[e]);
    choice[e] = score[e] + bias[e];
  }
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int a, int b) {
    return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
  });
  std::sort(order.begin(), order.begin() + top_k);
  double sum = 0.0;
  for (int64_t i = 0; i < top_k; ++i) sum += score[order[i]];
  for (int64_t i = 0; i < top_k; ++i) {
    ids[i] = order[i];
    const float s = score[order[i]];
    // 1e-20 only guards an all-zero selection (the reference's epsilon); it never changes a sum.
    weights[i] = renormalize ? static_cast<float>(s / (sum + 1e-20)) * scaling : s * scaling;
  }
}

Routing route_rows(const LayerContext& ctx, const Matrix& router,
                   const std::vector<float>& score_bias, const float* x) {
  const ModelConfig& c = ctx.c;
  const int64_t R = ctx.rows, E = c.moe.num_experts, k = c.moe.top_k;
  std::vector<float> logits(static_cast<size_t>(R * E));
  kernels::matmul(router, x, R, c.hidden, logits.data(), E, ctx.pool);  // fp32
  Routing out;
  out.ids.resize(static_cast<size_t>(R * k));
  out.weights.resize(static_cast<size_t>(R * k));
  std::vector<bool> chosen(static_cast<size_t>(E), false);
  for (int64_t r = 0; r < R; ++r) {
    route_row(logits.data() + r * E, score_bias.data(), E, k, c.moe.renormalize,
              c.moe.routed_scaling_factor, out.ids.data() + r * k, out.weights.data() + r * k);
    for (int64_t s = 0; s < k; ++s) chosen[static_cast<size_t>(out.ids[r * k + s])] = true;
  }
  for (int64_t e = 0; e < E; ++e) {
    if (chosen[static_cast<size_t>(e)]) out.experts.push_back(static_cast<int>(e));
  }
  return out;
}

MoePass::MoePass(const LayerContext& pass, const MoeTrunkWeights& w, int64_t block_rows)
    : pass_(pass), w_(w), block_rows_(block_rows > 0 ? block_rows : pass.rows) {
  const ModelConfig& c = pass.c;
  const auto R = static_cast<size_t>(pass.rows), k = static_cast<size_t>(c.moe.top_k);
  const auto Hl = static_cast<size_t>(c.moe.latent_dim);
  ids_.resize(R * k);
  wts_.resize(R * k);
  // Every row's latent input is written by route(), every (row, slot) by its expert.
  PassArena& arena = pass.arena != nullptr ? *pass.arena : own_arena_;
  arena.reset();
  xi_ = arena.take(static_cast<int64_t>(R * Hl));
  slot_ = arena.take(static_cast<int64_t>(R * k * Hl));
  chosen_.assign(static_cast<size_t>(c.moe.num_experts), false);
}

void MoePass::route(const LayerContext& block, int64_t first_row, const float* x) {
  const ModelConfig& c = pass_.c;
  const int64_t k = c.moe.top_k, Hl = c.moe.latent_dim;
  const Routing r = route_rows(block, w_.router, w_.score_bias, x);
  std::copy(r.ids.begin(), r.ids.end(), ids_.begin() + first_row * k);
  std::copy(r.weights.begin(), r.weights.end(), wts_.begin() + first_row * k);
  for (int e : r.experts) chosen_[static_cast<size_t>(e)] = true;
  kernels::matmul(w_.down, x, block.rows, c.hidden, xi_ + first_row * Hl, Hl, block.pool);
}

namespace {
// Experts gathered before a window goes to the device: enough for long grouped products whose
// uploads overlap, few enough that pinning them all asks little of an expert store's budget.
constexpr size_t kDeviceWindow = 16;
}  // namespace

// One expert over its (row, slot) users on the CPU, at most a block of rows at a time (a row's
// result does not depend on how many rows run beside it); outputs land in their (row, slot).
void MoePass::apply_on_cpu(const ExpertWeights& w, std::span<const int64_t> list) {
  const ModelConfig& c = pass_.c;
  const int64_t k = c.moe.top_k, Hl = c.moe.latent_dim, I = c.moe.intermediate;
  ThreadPool& pool = pass_.pool;
  const auto total = static_cast<int64_t>(list.size());
  for (int64_t b = 0; b < total; b += block_rows_) {
    const int64_t n = std::min(block_rows_, total - b);
    xe_.resize(static_cast<size_t>(n * Hl));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = list[static_cast<size_t>(b + i)] / k;
      std::copy_n(xi_ + r * Hl, Hl, xe_.data() + i * Hl);
    }
    ge_.resize(static_cast<size_t>(n * I));
    ue_.resize(static_cast<size_t>(n * I));
    ye_.resize(static_cast<size_t>(n * Hl));
    kernels::matmul(w.w1, xe_.data(), n, Hl, ge_.data(), I, pool);
    kernels::matmul(w.w3, xe_.data(), n, Hl, ue_.data(), I, pool);
    situ_parallel(pool, ge_.data(), ue_.data(), n * I, c.situ_beta, c.situ_linear_beta, ge_.data());
    kernels::matmul(w.w2, ge_.data(), n, I, ye_.data(), Hl, pool);
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(ye_.data() + i * Hl, Hl, slot_ + list[static_cast<size_t>(b + i)] * Hl);
  }
}

// A window of experts as two grouped products on the device; false (nothing written) when the
// device declines either.
bool MoePass::apply_on_device(kernels::MatmulOffload& device,
                              std::span<const std::pair<int, ExpertHandle>> window,
                              const std::vector<std::vector<int64_t>>& users) {
  const ModelConfig& c = pass_.c;
  const int64_t k = c.moe.top_k, Hl = c.moe.latent_dim, I = c.moe.intermediate;
  std::vector<std::vector<int32_t>> rows(window.size());
  int64_t total = 0;
  std::vector<kernels::RowGroup> gate_up, down;
  for (size_t e = 0; e < window.size(); ++e) {
    for (int64_t u : users[static_cast<size_t>(window[e].first)])
      rows[e].push_back(static_cast<int32_t>(u / k));
    total += static_cast<int64_t>(rows[e].size());
    gate_up.push_back({window[e].second->w1, rows[e]});
    gate_up.push_back({window[e].second->w3, rows[e]});
  }
  // [expert][gate rows, then up rows][I]
  std::vector<float> gu(static_cast<size_t>(2 * total * I));
  if (!device.grouped(gate_up, xi_, Hl, gu.data())) return false;
  std::vector<float> h(static_cast<size_t>(total * I));
  std::vector<int32_t> hrows(static_cast<size_t>(total));
  std::iota(hrows.begin(), hrows.end(), 0);
  int64_t at = 0;
  for (size_t e = 0; e < window.size(); ++e) {
    const auto n = static_cast<int64_t>(rows[e].size());
    const float* g = gu.data() + 2 * at * I;
    situ_parallel(pass_.pool, g, g + n * I, n * I, c.situ_beta, c.situ_linear_beta,
                  h.data() + at * I);
    down.push_back({window[e].second->w2, std::span<const int32_t>(hrows).subspan(
                                              static_cast<size_t>(at), static_cast<size_t>(n))});
    at += n;
  }
  std::vector<float> y(static_cast<size_t>(total * Hl));
  if (!device.grouped(down, h.data(), I, y.data())) return false;
  at = 0;
  for (const auto& [expert, handle] : window) {
    for (int64_t u : users[static_cast<size_t>(expert)])
      std::copy_n(y.data() + (at++) * Hl, Hl, slot_ + u * Hl);
  }
  return true;
}

int64_t MoePass::run_experts(ExpertProvider& experts, int layer,
                             const std::function<void()>& after_request) {
  const ModelConfig& c = pass_.c;
  const int64_t R = pass_.rows, E = c.moe.num_experts, k = c.moe.top_k;
  std::vector<int> wanted;
  for (int64_t e = 0; e < E; ++e) {
    if (chosen_[static_cast<size_t>(e)]) wanted.push_back(static_cast<int>(e));
  }
  // The expert -> (row, slot) lists over the whole pass.
  std::vector<std::vector<int64_t>> users(static_cast<size_t>(E));  // row * k + slot
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t s = 0; s < k; ++s)
      users[static_cast<size_t>(ids_[static_cast<size_t>(r * k + s)])].push_back(r * k + s);
  }
  kernels::MatmulOffload* device = kernels::current_offload();
  if (device != nullptr && !device->takes_grouped(R)) device = nullptr;
  std::vector<std::pair<int, ExpertHandle>> window;  // (expert id, pinned weights)
  auto flush = [&] {
    if (!apply_on_device(*device, window, users)) {
      for (const auto& [expert, handle] : window)
        apply_on_cpu(*handle, users[static_cast<size_t>(expert)]);
    }
    window.clear();
  };
  auto batch = experts.request(layer, wanted);
  if (after_request) after_request();
  size_t index = 0;
  ExpertHandle handle;
  while (batch->next(index, handle)) {
    if (device == nullptr) {
      apply_on_cpu(*handle, users[static_cast<size_t>(wanted[index])]);
    } else {
      window.emplace_back(wanted[index], std::move(handle));
      if (window.size() == kDeviceWindow) flush();
    }
    handle.reset();
  }
  if (!window.empty()) flush();
  return static_cast<int64_t>(wanted.size());
}

void MoePass::finish(const LayerContext& block, int64_t first_row, const float* x, float* y) {
  const ModelConfig& c = pass_.c;
  const int64_t n = block.rows, k = c.moe.top_k, Hl = c.moe.latent_dim;
  // Weighted sum per row in ascending expert order (slots are sorted by id), latent norm, up.
  std::vector<float> ybar(static_cast<size_t>(n * Hl), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = first_row + i;
    float* out = ybar.data() + i * Hl;
    for (int64_t s = 0; s < k; ++s) {
      kernels::active().axpy(wts_[static_cast<size_t>(r * k + s)], slot_ + (r * k + s) * Hl, out,
                             Hl);
    }
    if (c.moe.latent_norm) ops::rmsnorm(out, w_.latent_norm.data(), c.rms_eps, Hl, out);
  }
  kernels::matmul(w_.up, ybar.data(), n, Hl, y, c.hidden, block.pool);
  if (c.moe.num_shared_experts > 0) mlp_forward(block, w_.shared, x, y, /*accumulate=*/true);
}

int64_t moe_forward(const LayerContext& ctx, const MoeTrunkWeights& w, ExpertProvider& experts,
                    int layer, const float* x, float* y,
                    const std::function<void()>& after_request) {
  MoePass moe(ctx, w, ctx.rows);
  moe.route(ctx, 0, x);
  const int64_t fetched = moe.run_experts(experts, layer, after_request);
  moe.finish(ctx, 0, x, y);
  return fetched;
}

}  // namespace deltafin
