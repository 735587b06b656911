// The decoder loop with Attention Residuals (docs/MODEL.md §3.3) over a batch of rows. The loop
// in Model::forward is the spec's loop; what a batch of sequences adds around it (grouping and
// checking rows, deferred-commit records, routing prediction for the expert provider, the trunk
// leases) lives in the named helpers above it.
#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "model/layers.h"
#include "model/ops.h"

namespace deltafin {

namespace {

// Passes with more rows than this skip routing prediction: their union covers most experts.
constexpr int64_t kMaxPredictRows = 16;

void rmsnorm_rows(const float* x, const std::vector<float>& w, float eps, int64_t R, int64_t H,
                  float* out) {
  for (int64_t r = 0; r < R; ++r) ops::rmsnorm(x + r * H, w.data(), eps, H, out + r * H);
}

// The residual state carried through depth (§3.3): the banked anchors and the running partial
// sum p, which is "empty" right after a bank until the next sub-layer output lands in it.
class AttnResidual {
 public:
  AttnResidual(int64_t R, int64_t H, float eps, ThreadPool& pool)
      : R_(R), H_(H), eps_(eps), pool_(pool), partial_(static_cast<size_t>(R * H)) {}

  float* partial() { return partial_.data(); }

  // MIX(anchors ++ [p]): softmax over candidates of (score · c_j / rms(c_j)), applied to the
  // raw candidates. Before the first bank there is nothing to mix with: out = p.
  void mix(const std::vector<float>& score, float* out) const {
    if (anchors_.empty()) {
      std::copy(partial_.begin(), partial_.end(), out);
      return;
    }
    std::vector<const float*> cands;
    for (const auto& an : anchors_) cands.push_back(an.data());
    cands.push_back(partial_.data());
    const size_t n = cands.size();
    const int64_t H = H_;
    pool_.parallel_for(R_, 1, [&](int64_t b, int64_t e, int) {
      std::vector<float> s(n);
      for (int64_t r = b; r < e; ++r) {
        float mx = -INFINITY;
        for (size_t j = 0; j < n; ++j) {
          const float* cr = cands[j] + r * H;
          double d = 0.0;
          for (int64_t i = 0; i < H; ++i)
            d += static_cast<double>(cr[i]) * score[static_cast<size_t>(i)];
          s[j] = static_cast<float>(d) * ops::inv_rms(cr, H, eps_);  // the keys' RMSNorm, 1e-5
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (size_t j = 0; j < n; ++j) {
          s[j] = std::exp(s[j] - mx);
          sum += s[j];
        }
        float* o = out + r * H;
        std::fill(o, o + H, 0.0f);
        for (size_t j = 0; j < n; ++j) {
          kernels::active().axpy(static_cast<float>(s[j] / sum), cands[j] + r * H, o, H);
        }
      }
    });
  }

  // Banks the raw incoming partial as an anchor and resets the partial to empty.
  void bank() {
    anchors_.push_back(std::move(partial_));
    partial_.assign(static_cast<size_t>(R_ * H_), 0.0f);
    empty_ = true;
  }

  // p = (p empty) ? y : p + y. `y` may be swapped out (it stays a buffer of the same size).
  void add(std::vector<float>& y) {
    if (empty_) {
      partial_.swap(y);
      empty_ = false;
      return;
    }
    for (size_t j = 0; j < partial_.size(); ++j) partial_[j] += y[j];
  }

 private:
  int64_t R_, H_;
  float eps_;
  ThreadPool& pool_;
  std::vector<std::vector<float>> anchors_;
  std::vector<float> partial_;
  bool empty_ = false;
};

// A trunk layer (or the head) held for the duration of its compute, released even on a throw.
class LayerLease {
 public:
  LayerLease(TrunkProvider& t, int layer) : t_(t), layer_(layer), w_(t.acquire(layer)) {}
  ~LayerLease() { t_.release(layer_); }
  const LayerWeights* operator->() const { return &w_; }

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

// The pass's rows, grouped by sequence, after checking every input.
struct PassRows {
  std::vector<SeqRows> seqs;
  std::vector<int32_t> tokens;
  std::vector<int64_t> logit_rows;  // rows whose logits are returned, in output order
  int64_t count() const { return static_cast<int64_t>(tokens.size()); }
};

void check_input(const ModelConfig& c, const SequenceInput& s, const std::vector<SeqRows>& seen) {
  if (s.state == nullptr || s.tokens.empty())
    fail("forward: every sequence needs a state and at least one token");
  if (s.state->kda().size() != static_cast<size_t>(c.num_kda_layers()) ||
      s.state->mla().size() != static_cast<size_t>(c.num_mla_layers())) {
    fail("forward: state was made for a different model");
  }
  for (const auto& r : seen) {
    if (r.state == s.state) fail("forward: the same state appears twice in one pass");
  }
  if (!s.state->consistent())
    fail("forward: the state was left half-updated by a failed pass; reset it first");
  const int64_t end = s.state->position() + static_cast<int64_t>(s.tokens.size());
  if (end > c.max_positions)
    fail("sequence of {} tokens exceeds the model's context of {} positions", end, c.max_positions);
  for (int32_t t : s.tokens) {
    if (t < 0 || t >= c.vocab)
      fail("token id {} is outside the vocabulary (0..{})", t, c.vocab - 1);
  }
}

PassRows group_rows(const ModelConfig& c, std::span<SequenceInput> inputs) {
  PassRows p;
  for (auto& s : inputs) {
    check_input(c, s, p.seqs);
    SeqRows r;
    r.begin = p.count();
    r.count = static_cast<int64_t>(s.tokens.size());
    r.state = s.state;
    r.pending = s.pending;
    r.base = s.state->position();
    p.tokens.insert(p.tokens.end(), s.tokens.begin(), s.tokens.end());
    if (s.pending != nullptr) kda_begin_pending(c, r.base, r.count, *s.pending);
    if (s.all_logits) {
      for (int64_t t = 0; t < r.count; ++t) p.logit_rows.push_back(r.begin + t);
    } else {
      p.logit_rows.push_back(r.begin + r.count - 1);
    }
    p.seqs.push_back(r);
  }
  return p;
}

// Where this pass writes the taps of the sequences whose state has a recorder (model/taps.h).
// With none (no drafter) every call is a test of an empty vector.
class TapCapture {
 public:
  TapCapture(const std::vector<SeqRows>& seqs, int64_t H) : H_(H) {
    for (const SeqRows& s : seqs) {
      TapRecorder* rec = s.state->taps();
      if (rec == nullptr) continue;
      if (rec->hidden() != H)
        fail("forward: a tap recorder of width {} on a model of hidden {}", rec->hidden(), H);
      outs_.push_back({&s, rec, rec->stage(s.base, s.count)});
    }
  }
  // Copies the rows of `x` ([rows][hidden]) into every tap slot that asks for `layer`'s `stream`.
  void take(int layer, TapStream stream, const float* x) const {
    for (const Out& o : outs_) {
      const TapSpec& spec = o.rec->spec();
      if (spec.stream != stream) continue;
      const int64_t n = static_cast<int64_t>(spec.layers.size());
      for (int64_t j = 0; j < n; ++j) {
        if (spec.layers[static_cast<size_t>(j)] != layer) continue;
        for (int64_t t = 0; t < o.seq->count; ++t) {
          std::memcpy(o.buf + (t * n + j) * H_, x + (o.seq->begin + t) * H_,
                      static_cast<size_t>(H_) * sizeof(float));
        }
      }
    }
  }
  // Rows of plain passes are committed now; a deferred pass's wait for Model::commit.
  void publish() const {
    for (const Out& o : outs_) {
      if (o.seq->pending == nullptr) o.rec->publish(o.seq->count);
    }
  }

 private:
  struct Out {
    const SeqRows* seq;
    TapRecorder* rec;
    float* buf;
  };
  int64_t H_;
  std::vector<Out> outs_;
};

// §3.9: the mix over every anchor and the final partial, final norm, LM head on the rows whose
// logits are wanted. `a` is scratch [rows][hidden].
std::vector<float> head_logits(TrunkProvider& trunk, const LayerContext& ctx,
                               const AttnResidual& res, const std::vector<int64_t>& logit_rows,
                               float* a) {
  const ModelConfig& c = ctx.c;
  const int64_t H = c.hidden;
  const HeadLease head(trunk);
  res.mix(head->out_res_score, a);
  const int64_t n_out = static_cast<int64_t>(logit_rows.size());
  std::vector<float> normed(static_cast<size_t>(n_out * H));
  for (int64_t j = 0; j < n_out; ++j) {
    ops::rmsnorm(a + logit_rows[static_cast<size_t>(j)] * H, head->final_norm.data(), c.rms_eps, H,
                 normed.data() + j * H);
  }
  std::vector<float> logits(static_cast<size_t>(n_out * c.vocab));
  kernels::matmul(head->lm_head, normed.data(), n_out, H, logits.data(), c.vocab, ctx.pool);
  return logits;
}

}  // namespace

std::vector<AttnResStep> attn_res_plan(const ModelConfig& c) {
  std::vector<AttnResStep> plan;
  int anchors = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    AttnResStep s;
    s.anchors_before = anchors;
    s.bank = i % c.attn_res_block == 0;
    if (s.bank) ++anchors;
    s.anchors_after = anchors;
    plan.push_back(s);
  }
  return plan;
}

Model::Model(ModelParts parts)
    : keep_alive_(std::move(parts.keep_alive)),
      pool_(std::move(parts.pool)),
      offload_(std::move(parts.offload)),
      config_(std::move(parts.config)),
      trunk_(std::move(parts.trunk)),
      experts_(std::move(parts.experts)),
      trunk_bytes_per_pass_(parts.trunk_bytes_per_pass),
      plan_(attn_res_plan(config_)) {
  if (!trunk_ || !experts_) fail("internal: a model needs a trunk and an expert provider");
}

Model::~Model() {
  offload_.reset();  // the device may hold views of the trunk's memory: release it first
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

// Routing prediction for the expert provider: the next MoE layer's router applied to this
// layer's MLP-side mix `m`, read ahead while this layer computes. It only schedules reads; the
// real router always decides.
class Model::Predictor {
 public:
  Predictor(Model& m, const LayerContext& ctx) : m_(m), ctx_(ctx) {
    predict_ = m.experts_->wants_prefetch() && ctx.rows <= kMaxPredictRows;
  }
  void prefetch_after(int layer, const float* m) const {
    const int next = layer + 1;
    if (!predict_ || next >= ctx_.c.num_layers || ctx_.c.is_dense(next)) return;
    const RouterWeights* rw = m_.trunk_->router(next);
    if (rw == nullptr) return;
    std::vector<float> normed(static_cast<size_t>(ctx_.rows * ctx_.c.hidden));
    rmsnorm_rows(m, rw->post_norm, ctx_.c.rms_eps, ctx_.rows, ctx_.c.hidden, normed.data());
    const Routing r = route_rows(ctx_, rw->router, rw->score_bias, normed.data());
    m_.experts_->prefetch(next, r.experts);
  }

 private:
  Model& m_;
  const LayerContext& ctx_;
  bool predict_ = false;
};

std::vector<float> Model::forward(std::span<SequenceInput> seqs) {
  Stopwatch sw;
  const ModelConfig& c = config_;
  const int64_t H = c.hidden;
  PassRows rows = group_rows(c, seqs);
  const int64_t R = rows.count();
  const LayerContext ctx{c, pool_ ? *pool_ : global_pool(), rows.seqs, R};
  const kernels::OffloadScope offload(offload_.get());  // null: every product on the CPU
  const Predictor predictor(*this, ctx);
  for (auto& s : rows.seqs) s.state->set_consistent(false);  // until the pass completes

  AttnResidual res(R, H, c.rms_eps, ctx.pool);
  const TapCapture taps(rows.seqs, H);
  trunk_->embed(rows.tokens, res.partial());  // p = h0, decoded from BF16 exactly
  std::vector<float> a(static_cast<size_t>(R * H)), u(a.size()), y(a.size());
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerLease w(*trunk_, i);
    res.mix(w->attn_res_score, a.data());
    if (i > 0) taps.take(i - 1, TapStream::kMixture, a.data());
    if (plan_[static_cast<size_t>(i)].bank) res.bank();  // the raw incoming partial
    rmsnorm_rows(a.data(), w->input_norm, c.rms_eps, R, H, u.data());
    if (c.is_mla(i)) {
      mla_forward(ctx, w->mla, i, u.data(), y.data());
    } else {
      kda_forward(ctx, w->kda, i, u.data(), y.data());
    }
    res.add(y);
    res.mix(w->mlp_res_score, a.data());  // anchors are never empty here
    rmsnorm_rows(a.data(), w->post_norm, c.rms_eps, R, H, u.data());
    if (c.is_dense(i)) {
      predictor.prefetch_after(i, a.data());
      mlp_forward(ctx, w->dense, u.data(), y.data(), false);
    } else {
      pass_stats_.expert_uses += R * c.moe.top_k;
      pass_stats_.expert_fetches += moe_forward(ctx, w->moe, *experts_, i, u.data(), y.data(),
                                                [&] { predictor.prefetch_after(i, a.data()); });
    }
    res.add(y);
    taps.take(i, TapStream::kPartial, res.partial());
  }

  std::vector<float> logits = head_logits(*trunk_, ctx, res, rows.logit_rows, a.data());
  for (auto& s : rows.seqs) {
    s.state->set_position(s.base + s.count);
    s.state->set_consistent(true);
  }
  taps.publish();
  pass_stats_.passes++;
  pass_stats_.rows += R;
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
