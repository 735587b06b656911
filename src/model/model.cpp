// The decoder (docs/MODEL.md §3) over a batch of rows. Model::forward is the spec's loop,
// one named step per line, for every family: what differs between K3 and Kimi-Linear (docs/
// FAMILY.md) is which component each step calls, chosen from the config — the residual stream
// (residual.h: Attention Residuals or pre-norm), the attention variants inside kda_forward /
// mla_forward, the activation and MoE flavour inside mlp_forward / MoePass. A pre-norm stream
// never banks, so its loop is the same loop with no bank steps. The Pass below carries each step
// out over the pass's rows — in
// blocks for long prompts (pass_plan.h), copying the target taps drafters read (taps.h), and
// handing the expert provider its routing prediction (a hint for reads; the router decides).
// How the routed experts of a step are scheduled, and on which device the products run, is not
// decided here: the expert provider carries out each ExpertStep (experts.h) and the engine sets
// the environment a pass runs in (ModelParts::pass_environment).
#include "model/model.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "core/trace.h"
#include "kernels/kernels.h"
#include "model/layers.h"
#include "model/ops.h"
#include "model/pass_rows.h"
#include "model/residual.h"

namespace deltafin {

namespace {

// Passes with more rows than this skip routing prediction: their union covers most experts.
constexpr int64_t kMaxPredictRows = 16;

void rmsnorm_rows(const float* x, const std::vector<float>& w, float eps, int64_t R, int64_t H,
                  float* out) {
  for (int64_t r = 0; r < R; ++r) ops::rmsnorm(x + r * H, w.data(), eps, H, out + r * H);
}

// A trunk layer (or the head) held for the duration of its compute, released even on a throw.
class LayerLease {
 public:
  LayerLease(TrunkProvider& t, int layer) : t_(t), layer_(layer), w_(t.acquire(layer)) {}
  ~LayerLease() { t_.release(layer_); }
  const LayerWeights& operator*() const { return w_; }

 private:
  TrunkProvider& t_;
  int layer_;
  const LayerWeights& w_;
};

class HeadLease {
 public:
  explicit HeadLease(TrunkProvider& t) : t_(t), w_(t.acquire_head()) {}
  ~HeadLease() { t_.release_head(); }
  const HeadWeights* operator->() const { return &w_; }

 private:
  TrunkProvider& t_;
  const HeadWeights& w_;
};

}  // namespace

std::vector<AttnResStep> attn_res_plan(const ModelConfig& c) {
  std::vector<AttnResStep> plan;
  int anchors = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    AttnResStep s;
    s.anchors_before = anchors;
    s.bank = c.residual == ResidualForm::kAttnRes && i % c.attn_res_block == 0;
    if (s.bank) ++anchors;
    s.anchors_after = anchors;
    plan.push_back(s);
  }
  return plan;
}

// One forward pass: its rows (checked and grouped by sequence), the residual stream, the blocks
// it is computed in and its taps. Each public member is one step of the loop in docs/MODEL.md
// §3.3 over all the pass's rows.
class Model::Pass {
 public:
  Pass(Model& m, std::span<SequenceInput> seqs)
      : m_(m),
        c_(m.config_),
        rows_(group_rows(c_, seqs)),
        ctx_{c_, m.pool(), rows_.seqs, rows_.count(), &arena_},
        predict_(m.experts_->wants_prefetch() && rows_.count() <= kMaxPredictRows) {
    for (auto& s : rows_.seqs) s.state->set_consistent(false);  // until the pass completes
    res_ = make_residual(c_, rows_.count(), ctx_.pool);
    taps_.emplace(rows_.seqs, c_.hidden);
    blocks_ = split_blocks(rows_, m.pass_plan_.block_rows);
    int64_t most = 0;
    for (const auto& b : blocks_) {
      bctx_.push_back(LayerContext{c_, ctx_.pool, b.seqs, b.rows(), &arena_});
      most = std::max(most, bctx_.back().rows);
    }
    a_.resize(static_cast<size_t>(most * c_.hidden));
    u_.resize(a_.size());
    y_.resize(a_.size());
  }

  int64_t rows() const { return rows_.count(); }

  // §3.2: p = h0, the tokens' embedding rows decoded from BF16 exactly; rows the caller gives
  // (an image's projector rows, docs/VISION.md §6) replace theirs.
  void embed() {
    TraceSpan span("embed", "model", {{"rows", rows()}});
    float* p = res_->partial();
    m_.trunk_->embed(rows_.tokens, p);
    for (const auto& [row, values] : rows_.given_rows)
      std::copy_n(values, c_.hidden, p + row * c_.hidden);
  }

  // anchors.append(p); p = EMPTY — the raw incoming partial.
  void bank() { res_->bank(); }

  // a = MIX(anchors ++ [p], attention score); p += ATTN_i(RMSNorm(a; input_layernorm)), with
  // ATTN the layer's KDA (§3.4–3.5) or MLA (§3.6). `a` is the mixture stream a drafter may tap.
  void attention(int i, const LayerWeights& w) {
    TraceSpan span("attention", "model", {{"layer", i}, {"mla", c_.is_mla(i)}});
    for (size_t j = 0; j < blocks_.size(); ++j) {
      mix_norm(w.attn_res_score, w.input_norm, j);
      if (i > 0)
        taps_->take(i - 1, TapStream::kMixture, a_.data(), blocks_[j].first, bctx_[j].rows);
      if (c_.is_mla(i)) {
        mla_forward(bctx_[j], w.mla, i, u_.data(), y_.data());
      } else {
        kda_forward(bctx_[j], w.kda, i, u_.data(), y_.data());
      }
      res_->add(blocks_[j].first, bctx_[j].rows, y_.data());
    }
    res_->end_add();
  }

  // m = MIX(anchors ++ [p], MLP score); p += FFN_i(RMSNorm(m; post_attention_layernorm)), with
  // FFN the dense MLP (§3.7; SiTU or SiLU) or the MoE (§3.8: latent, or plain with shared experts).
  void ffn(int i, const LayerWeights& w) {
    TraceSpan span(c_.is_dense(i) ? "dense mlp" : "moe", "model", {{"layer", i}});
    if (c_.is_dense(i)) {
      for (size_t j = 0; j < blocks_.size(); ++j) {
        mix_norm(w.mlp_res_score, w.post_norm, j);
        if (j == 0) predict_routing(i + 1);
        mlp_forward(bctx_[j], w.dense, u_.data(), y_.data(), false);
        res_->add(blocks_[j].first, bctx_[j].rows, y_.data());
      }
    } else {
      MoePass moe(ctx_, w.moe, m_.pass_plan_.block_rows);
      for (size_t j = 0; j < blocks_.size(); ++j) {
        mix_norm(w.mlp_res_score, w.post_norm, j);
        moe.route(bctx_[j], blocks_[j].first, u_.data());
      }
      m_.pass_stats_.expert_uses += rows() * c_.moe.top_k;
      // A pass of one block computes its shared experts while the routed experts' reads are in
      // flight (its normed input stays in u, y is free until finish); longer passes reuse u and
      // y per block, so theirs run in finish as before. Providers that never call `issued`
      // leave `shared_done` false, and finish computes them.
      const bool early = blocks_.size() == 1 && c_.moe.num_shared_experts > 0;
      bool shared_done = false;
      m_.pass_stats_.expert_fetches += moe.run_experts(*m_.experts_, i, [&] {
        predict_routing(i + 1);  // its prefetch reads queue first: the drive does not wait
        if (early && !shared_done) {
          moe.shared(bctx_[0], u_.data(), y_.data(), i);
          shared_done = true;
        }
      });
      for (size_t j = 0; j < blocks_.size(); ++j) {
        if (blocks_.size() > 1) mix_norm(w.mlp_res_score, w.post_norm, j);  // else still in u
        moe.finish(bctx_[j], blocks_[j].first, u_.data(), y_.data(), shared_done);
        res_->add(blocks_[j].first, bctx_[j].rows, y_.data());
      }
    }
    res_->end_add();
  }

  // The partial stream after layer i, for a drafter that taps it.
  void tap(int i) { taps_->take(i, TapStream::kPartial, res_->partial()); }

  // §3.9: out = MIX(anchors ++ [p], output score); logits = W_lm RMSNorm(out; norm), only for
  // the rows whose logits are wanted (only those rows are mixed) — and RMSNorm(out; norm) of
  // every row for a drafter that taps the final-normed stream (taps.h, kFinal).
  std::vector<float> logits() {
    TraceSpan span("lm head", "model", {{"rows", static_cast<int64_t>(rows_.logit_rows.size())}});
    const int64_t H = c_.hidden;
    const HeadLease head(*m_.trunk_);
    const auto n_out = static_cast<int64_t>(rows_.logit_rows.size());
    std::vector<float> mixed(static_cast<size_t>(H)), normed(static_cast<size_t>(n_out * H));
    for (int64_t j = 0; j < n_out; ++j) {
      res_->mix(head->out_res_score, rows_.logit_rows[static_cast<size_t>(j)], 1, mixed.data());
      ops::rmsnorm(mixed.data(), head->final_norm.data(), c_.rms_eps, H, normed.data() + j * H);
    }
    if (taps_->wants(TapStream::kFinal)) {
      // Every row's final-normed hidden, for a drafter reading what the head reads (MTP).
      std::vector<float> all(static_cast<size_t>(rows() * H));
      for (int64_t r = 0; r < rows(); ++r) {
        res_->mix(head->out_res_score, r, 1, mixed.data());
        ops::rmsnorm(mixed.data(), head->final_norm.data(), c_.rms_eps, H, all.data() + r * H);
      }
      taps_->take(static_cast<int>(c_.num_layers) - 1, TapStream::kFinal, all.data());
    }
    std::vector<float> logits(static_cast<size_t>(n_out * c_.vocab));
    kernels::matmul(head->lm_head, normed.data(), n_out, H, logits.data(), c_.vocab, ctx_.pool);
    return logits;
  }

  // Every sequence advanced by its rows and consistent again; plain passes' taps published.
  void complete() {
    for (auto& s : rows_.seqs) {
      s.state->set_position(s.base + s.count);
      s.state->set_consistent(true);
    }
    taps_->publish();
  }

 private:
  // a = MIX(score) and u = RMSNorm(a) for block j.
  void mix_norm(const std::vector<float>& score, const std::vector<float>& norm, size_t j) {
    res_->mix(score, blocks_[j].first, bctx_[j].rows, a_.data());
    rmsnorm_rows(a_.data(), norm, c_.rms_eps, bctx_[j].rows, c_.hidden, u_.data());
  }

  // Routing prediction for the expert provider: MoE layer `next`'s router applied to this
  // layer's MLP-side mix (in `a`: prediction only runs on passes of a few rows, which are one
  // block), handed over as a prefetch hint. It schedules reads only; the real router decides.
  void predict_routing(int next) {
    if (!predict_ || next >= c_.num_layers || c_.is_dense(next)) return;
    const RouterWeights* rw = m_.trunk_->router(next);
    if (rw == nullptr) return;
    std::vector<float> normed(static_cast<size_t>(rows() * c_.hidden));
    rmsnorm_rows(a_.data(), rw->post_norm, c_.rms_eps, rows(), c_.hidden, normed.data());
    const Routing r = route_rows(ctx_, rw->router, rw->score_bias, normed.data());
    if (rows() != 1) {
      m_.experts_->prefetch(next, r.experts);
      return;
    }
    // One row: its choice most confident first (the store may read only the first few).
    std::vector<size_t> rank(r.ids.size());
    std::iota(rank.begin(), rank.end(), size_t{0});
    std::stable_sort(rank.begin(), rank.end(),
                     [&](size_t a, size_t b) { return r.weights[a] > r.weights[b]; });
    std::vector<int> order;
    for (size_t i : rank) order.push_back(r.ids[i]);
    m_.experts_->prefetch(next, order);
  }

  Model& m_;
  const ModelConfig& c_;
  PassRows rows_;
  PassArena arena_;
  LayerContext ctx_;
  bool predict_;
  std::unique_ptr<ResidualStream> res_;
  std::optional<TapCapture> taps_;
  std::vector<PassBlock> blocks_;
  std::vector<LayerContext> bctx_;
  std::vector<float> a_, u_, y_;  // per block row: the mix, its norm, a sub-layer's output
};

Model::Model(ModelParts parts)
    : keep_alive_(std::move(parts.keep_alive)),
      pool_(std::move(parts.pool)),
      pass_environment_(std::move(parts.pass_environment)),
      config_(std::move(parts.config)),
      trunk_(std::move(parts.trunk)),
      experts_(std::move(parts.experts)),
      trunk_bytes_per_pass_(parts.trunk_bytes_per_pass),
      plan_(attn_res_plan(config_)),
      pass_plan_(parts.pass_plan) {
  if (!trunk_ || !experts_) fail("internal: a model needs a trunk and an expert provider");
}

Model::~Model() {
  // What a pass runs inside (a device) may hold views of the trunk's memory: release it first.
  pass_environment_ = nullptr;
}

std::string Model::describe() const {
  return fmt::format("trunk: {}; experts: {}", trunk_->describe(), experts_->describe());
}

std::vector<float> Model::forward(State& state, std::span<const int32_t> tokens, bool all_logits) {
  SequenceInput in;
  in.state = &state;
  in.tokens = tokens;
  in.all_logits = all_logits;
  return forward(std::span<SequenceInput>(&in, 1));
}

std::vector<float> Model::forward(std::span<SequenceInput> seqs) {
  Stopwatch sw;
  Pass pass(*this, seqs);
  TraceSpan span("pass", "model", {{"rows", pass.rows()}});
  std::vector<float> logits;
  const auto decoder = [&] {
    pass.embed();  // p = h0
    for (int i = 0; i < config_.num_layers; ++i) {
      TraceSpan layer_span("layer", "model", {{"layer", i}});
      const LayerLease w(*trunk_, i);
      if (plan_[static_cast<size_t>(i)].bank) pass.bank();  // anchors.append(p); p = EMPTY
      pass.attention(i, *w);                                // p += ATTN(RMSNorm(MIX))
      pass.ffn(i, *w);                                      // p += FFN(RMSNorm(MIX))
      pass.tap(i);                                          // p, for a drafter
    }
    logits = pass.logits();  // LM head over MIX(anchors ++ [p]), final norm
  };
  if (pass_environment_) {
    pass_environment_(decoder);
  } else {
    decoder();
  }
  pass.complete();
  pass_stats_.passes++;
  pass_stats_.rows += pass.rows();
  pass_stats_.seconds += sw.elapsed();
  return logits;
}

void Model::embed(std::span<const int32_t> tokens, float* out) {
  for (int32_t t : tokens) {
    if (t < 0 || t >= config_.vocab)
      fail("token id {} is outside the vocabulary (0..{})", t, config_.vocab - 1);
  }
  trunk_->embed(tokens, out);
}

void Model::lm_head(const float* rows, int64_t n, float* logits) {
  const HeadLease head(*trunk_);
  kernels::matmul(head->lm_head, rows, n, config_.hidden, logits, config_.vocab, pool());
}

void Model::commit(State& state, const PendingCommit& pending, int64_t accepted) const {
  if (accepted < 0 || accepted > pending.rows) {
    fail("commit: accepted {} of a pass of {} rows", accepted, pending.rows);
  }
  if (state.position() != pending.base_position + pending.rows) {
    fail("commit: the state moved since the deferred pass (position {}, expected {})",
         state.position(), pending.base_position + pending.rows);
  }
  for (size_t l = 0; l < state.kda().size(); ++l) {
    kda_commit(config_, pending.layers[l], pending.rows, accepted, state.kda()[l]);
  }
  if (state.taps() != nullptr) state.taps()->publish(accepted);  // the accepted rows' taps only
  state.truncate(pending.base_position + accepted);
}

}  // namespace deltafin
