// The dense MLP (layer 0 and the shared experts) and the MoE with its router (docs/MODEL.md
// §3.7–3.8), with the family's components from the config: the activation (K3's SiTU, SiLU for
// Kimi-Linear and DeepSeek-V3/K2) and the MoE flavour — K3's latent MoE (experts in a latent
// space entered by routed_expert_down_proj, left by the norm and routed_expert_up_proj) or the
// plain MoE (experts read the normed hidden row and their weighted sum is the output; FAMILY.md
// KL.8). Routing is per row; then the pass's routed-expert step — every
// selected expert applied once to all the rows that chose it, whichever sequences (and blocks of
// a long pass, pass_plan.h) they belong to — goes to the expert provider, which carries it out
// (model/experts.h: ExpertStep; when and where each expert runs is the provider's). Each row's
// expert outputs are then summed in ascending expert-id order, so the result does not depend on
// the order experts ran in, on batching or on the thread count.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/thread_pool.h"
#include "core/trace.h"
#include "kernels/kernels.h"
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

// The config's activation of a gated MLP, h = act(g, u), split over the pool (element-wise).
void activate_parallel(ThreadPool& pool, const ModelConfig& c, const float* g, const float* u,
                       int64_t n, float* out) {
  if (c.activation == Activation::kSiTU) {
    situ_parallel(pool, g, u, n, c.situ_beta, c.situ_linear_beta, out);
    return;
  }
  pool.parallel_for(
      n, 4096, [&](int64_t b, int64_t e, int) { ops::silu_rows(g + b, u + b, e - b, out + b); });
}

}  // namespace

void mlp_forward(const LayerContext& ctx, const MlpWeights& w, const float* x, float* y,
                 bool accumulate) {
  const int64_t R = ctx.rows, H = ctx.c.hidden, I = w.gate.rows;
  std::vector<float> g(static_cast<size_t>(R * I)), u(static_cast<size_t>(R * I));
  kernels::matmul(w.gate, x, R, H, g.data(), I, ctx.pool);
  kernels::matmul(w.up, x, R, H, u.data(), I, ctx.pool);
  activate_parallel(ctx.pool, ctx.c, g.data(), u.data(), R * I, g.data());
  kernels::matmul(w.down, g.data(), R, I, y, H, ctx.pool, accumulate);
}

void route_row(const float* logits, const float* bias, int64_t E, int64_t top_k, bool renormalize,
               float scaling, int* ids, float* weights) {
  route_row(logits, bias, E, top_k, renormalize, scaling, 1, 1, ids, weights);
}

void route_row(const float* logits, const float* bias, int64_t E, int64_t top_k, bool renormalize,
               float scaling, int64_t groups, int64_t topk_groups, int* ids, float* weights) {
  thread_local std::vector<int> order;
  thread_local std::vector<float> score, choice;
  order.resize(static_cast<size_t>(E));
  score.resize(static_cast<size_t>(E));
  choice.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    score[e] = ops::sigmoid(logits[e]);
    choice[e] = score[e] + bias[e];
  }
  if (groups > 1) {
    // Group-limited selection (DeepSeek-V3): a group's score is the sum of its two best biased
    // scores (exact in double); the topk_groups best groups (ties: lower group) keep their
    // experts, every other expert is out of the running (−∞).
    thread_local std::vector<double> gscore;
    thread_local std::vector<int> gorder;
    const int64_t per = E / groups;
    gscore.resize(static_cast<size_t>(groups));
    gorder.resize(static_cast<size_t>(groups));
    for (int64_t g = 0; g < groups; ++g) {
      float a = -INFINITY, b = -INFINITY;  // the best two of the group
      for (int64_t e = g * per; e < (g + 1) * per; ++e) {
        if (choice[e] > a) {
          b = a;
          a = choice[e];
        } else if (choice[e] > b) {
          b = choice[e];
        }
      }
      gscore[g] = static_cast<double>(a) + static_cast<double>(b);
    }
    std::iota(gorder.begin(), gorder.end(), 0);
    std::partial_sort(
        gorder.begin(), gorder.begin() + topk_groups, gorder.end(),
        [&](int x, int y) { return gscore[x] > gscore[y] || (gscore[x] == gscore[y] && x < y); });
    for (int64_t i = topk_groups; i < groups; ++i) {
      const int64_t g = gorder[i];
      std::fill(choice.begin() + g * per, choice.begin() + (g + 1) * per, -INFINITY);
    }
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
              c.moe.routed_scaling_factor, c.moe.num_groups, c.moe.topk_groups,
              out.ids.data() + r * k, out.weights.data() + r * k);
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
  const auto Hl = static_cast<size_t>(c.expert_dim());
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
  const int64_t k = c.moe.top_k, Hl = c.expert_dim();
  TraceSpan span("router", "model", {{"rows", block.rows}});
  const Routing r = route_rows(block, w_.router, w_.score_bias, x);
  std::copy(r.ids.begin(), r.ids.end(), ids_.begin() + first_row * k);
  std::copy(r.weights.begin(), r.weights.end(), wts_.begin() + first_row * k);
  for (int e : r.experts) chosen_[static_cast<size_t>(e)] = true;
  if (c.moe.flavour == MoeFlavour::kLatent) {
    kernels::matmul(w_.down, x, block.rows, c.hidden, xi_ + first_row * Hl, Hl, block.pool);
  } else {
    std::copy_n(x, block.rows * Hl, xi_ + first_row * Hl);  // experts read the normed rows
  }
}

// One expert over its (row, slot) users, at most a block of rows at a time (a row's result does
// not depend on how many rows run beside it); outputs land in their (row, slot).
void MoePass::apply_expert(const ExpertWeights& w, std::span<const int64_t> list) {
  const ModelConfig& c = pass_.c;
  const int64_t k = c.moe.top_k, Hl = c.expert_dim(), I = c.moe.intermediate;
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
    activate_parallel(pool, c, ge_.data(), ue_.data(), n * I, ge_.data());
    kernels::matmul(w.w2, ge_.data(), n, I, ye_.data(), Hl, pool);
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(ye_.data() + i * Hl, Hl, slot_ + list[static_cast<size_t>(b + i)] * Hl);
  }
}

int64_t MoePass::run_experts(ExpertProvider& experts, int layer,
                             const std::function<void()>& issued) {
  const ModelConfig& c = pass_.c;
  TraceSpan span("routed experts", "model", {{"layer", layer}, {"rows", pass_.rows}});
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
  ExpertStep step;
  step.layer = layer;
  step.experts = wanted;
  step.users = users;
  step.rows = R;
  step.top_k = k;
  step.in = xi_;
  step.in_dim = c.expert_dim();
  step.inner_dim = c.moe.intermediate;
  step.out = slot_;
  step.apply = [this](const ExpertWeights& w, std::span<const int64_t> list) {
    apply_expert(w, list);
  };
  step.activate = [&](const float* g, const float* u, int64_t n, float* h) {
    activate_parallel(pass_.pool, c, g, u, n, h);
  };
  step.issued = issued;
  experts.run(step);
  return static_cast<int64_t>(wanted.size());
}

void MoePass::finish(const LayerContext& block, int64_t first_row, const float* x, float* y,
                     bool shared_in_y) {
  const ModelConfig& c = pass_.c;
  const int64_t n = block.rows, k = c.moe.top_k, Hl = c.expert_dim();
  if (c.moe.flavour == MoeFlavour::kPlain) {
    // y = Σ w_e · expert_e(x) per row in ascending expert order, + the shared experts. With
    // the shared experts already in y, the routed sum is formed apart and added once: the same
    // two terms as the shared matmul's accumulate adds (y + Σ, one rounding), in either order.
    std::vector<float> routed;
    float* sum = y;
    if (shared_in_y) {
      routed.assign(static_cast<size_t>(n * Hl), 0.0f);
      sum = routed.data();
    } else {
      std::fill(y, y + n * Hl, 0.0f);
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = first_row + i;
      for (int64_t s = 0; s < k; ++s) {
        kernels::active().axpy(wts_[static_cast<size_t>(r * k + s)], slot_ + (r * k + s) * Hl,
                               sum + i * Hl, Hl);
      }
    }
    if (shared_in_y) {
      for (int64_t j = 0; j < n * Hl; ++j) y[j] = sum[j] + y[j];
      return;
    }
    TraceSpan shared_span("shared experts", "model", {{"rows", n}});
    if (c.moe.num_shared_experts > 0) mlp_forward(block, w_.shared, x, y, /*accumulate=*/true);
    return;
  }
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
  // up · ybar + shared(x): whichever of the two is in y first, the other's dot product is
  // added to it once (kernels.h: y = y + Σ), so both orders give the same floats.
  kernels::matmul(w_.up, ybar.data(), n, Hl, y, c.hidden, block.pool, /*accumulate=*/shared_in_y);
  if (shared_in_y) return;
  TraceSpan shared_span("shared experts", "model", {{"rows", n}});
  if (c.moe.num_shared_experts > 0) mlp_forward(block, w_.shared, x, y, /*accumulate=*/true);
}

void MoePass::shared(const LayerContext& block, const float* x, float* y, int layer) {
  TraceSpan span("shared experts", "model",
                 {{"rows", block.rows}, {"layer", layer}, {"overlapped", 1}});
  mlp_forward(block, w_.shared, x, y, /*accumulate=*/false);
}

int64_t moe_forward(const LayerContext& ctx, const MoeTrunkWeights& w, ExpertProvider& experts,
                    int layer, const float* x, float* y, const std::function<void()>& issued) {
  MoePass moe(ctx, w, ctx.rows);
  moe.route(ctx, 0, x);
  const int64_t fetched = moe.run_experts(experts, layer, issued);
  moe.finish(ctx, 0, x, y);
  return fetched;
}

}  // namespace deltafin
