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

  // MIX(anchors ++ [p]) for rows [first, first + n) into out[n][H]: softmax over candidates of
  // (score · c_j / rms(c_j)), applied to the raw candidates. A partial that is empty (just
  // banked, nothing added yet) is no candidate: it is the last anchor now, so mixing right after
  // a bank is the spec's mix right before it. A single candidate is the value itself (the spec's
  // "nothing to mix with" before the first bank; a softmax over one is 1 exactly anyway).
  void mix(const std::vector<float>& score, int64_t first, int64_t n_rows, float* out) const {
    std::vector<const float*> cands;
    for (const auto& an : anchors_) cands.push_back(an.data());
    if (!empty_) cands.push_back(partial_.data());
    const size_t n = cands.size();
    const int64_t H = H_;
    if (n == 1) {
      std::copy_n(cands[0] + first * H, n_rows * H, out);
      return;
    }
    pool_.parallel_for(n_rows, 1, [&](int64_t b, int64_t e, int) {
      std::vector<float> s(n);
      for (int64_t i = b; i < e; ++i) {
        const int64_t r = first + i;
        float mx = -INFINITY;
        for (size_t j = 0; j < n; ++j) {
          const float* cr = cands[j] + r * H;
          double d = 0.0;
          for (int64_t x = 0; x < H; ++x)
            d += static_cast<double>(cr[x]) * score[static_cast<size_t>(x)];
          s[j] = static_cast<float>(d) * ops::inv_rms(cr, H, eps_);  // the keys' RMSNorm, 1e-5
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (size_t j = 0; j < n; ++j) {
          s[j] = std::exp(s[j] - mx);
          sum += s[j];
        }
        float* o = out + i * H;
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

  // p = (p empty) ? y : p + y for rows [first, first + n); end_add() closes the sub-layer once
  // all its rows have landed.
  void add(int64_t first, int64_t n, const float* y) {
    float* p = partial_.data() + first * H_;
    if (empty_) {
      std::copy_n(y, n * H_, p);
      return;
    }
    for (int64_t j = 0; j < n * H_; ++j) p[j] += y[j];
  }
  void end_add() { empty_ = false; }

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
    r.pass_count = r.count;
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
  // Copies the rows of `x` into every tap slot that asks for `layer`'s `stream`; `x` holds the
  // pass rows [first, first + n) ([n][hidden]: one block of a blocked prompt pass, or all rows).
  void take(int layer, TapStream stream, const float* x, int64_t first = 0,
            int64_t n_rows = INT64_MAX) const {
    for (const Out& o : outs_) {
      const TapSpec& spec = o.rec->spec();
      if (spec.stream != stream) continue;
      const int64_t n = static_cast<int64_t>(spec.layers.size());
      for (int64_t j = 0; j < n; ++j) {
        if (spec.layers[static_cast<size_t>(j)] != layer) continue;
        for (int64_t t = 0; t < o.seq->count; ++t) {
          const int64_t r = o.seq->begin + t;
          if (r < first || r - first >= n_rows) continue;
          std::memcpy(o.buf + (t * n + j) * H_, x + (r - first) * H_,
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
// logits are wanted (only those rows are mixed).
std::vector<float> head_logits(TrunkProvider& trunk, const LayerContext& ctx,
                               const AttnResidual& res, const std::vector<int64_t>& logit_rows) {
  const ModelConfig& c = ctx.c;
  const int64_t H = c.hidden;
  const HeadLease head(trunk);
  const int64_t n_out = static_cast<int64_t>(logit_rows.size());
  std::vector<float> mixed(static_cast<size_t>(H)), normed(static_cast<size_t>(n_out * H));
  for (int64_t j = 0; j < n_out; ++j) {
    res.mix(head->out_res_score, logit_rows[static_cast<size_t>(j)], 1, mixed.data());
    ops::rmsnorm(mixed.data(), head->final_norm.data(), c.rms_eps, H, normed.data() + j * H);
  }
  std::vector<float> logits(static_cast<size_t>(n_out * c.vocab));
  kernels::matmul(head->lm_head, normed.data(), n_out, H, logits.data(), c.vocab, ctx.pool);
  return logits;
}

// The pass's rows in blocks of at most `block_rows` (pass_plan.h). Blocks are consecutive runs
// of the pass's rows; a sequence is only cut at a multiple of the KDA chunk from its own first
// row, so its chunked recurrence is the one an uncut pass runs. Each part is positioned where
// the previous one left its sequence. Deferred passes (a few drafted rows) stay one block: their
// records are laid out for the whole pass.
struct PassBlock {
  int64_t first = 0;
  std::vector<SeqRows> seqs;
};

std::vector<PassBlock> split_blocks(const PassRows& rows, int64_t block_rows) {
  const int64_t R = rows.count();
  bool pending = false;
  for (const auto& s : rows.seqs) pending = pending || s.pending != nullptr;
  if (pending || block_rows < kPassBlockQuantum || R <= block_rows)
    return {PassBlock{0, rows.seqs}};
  std::vector<PassBlock> blocks(1);
  int64_t used = 0;  // rows in the open block
  for (const auto& s : rows.seqs) {
    for (int64_t off = 0; off < s.count;) {
      int64_t take = std::min(s.count - off, block_rows - used);
      if (take < s.count - off) take = take / kPassBlockQuantum * kPassBlockQuantum;
      if (take == 0) {  // no whole chunk fits: the rest of this sequence opens the next block
        blocks.push_back(PassBlock{blocks.back().first + used, {}});
        used = 0;
        continue;
      }
      SeqRows part = s;
      part.begin = used;
      part.count = take;
      part.base = s.base + off;
      blocks.back().seqs.push_back(part);
      used += take;
      off += take;
      if (used == block_rows && (off < s.count || &s != &rows.seqs.back())) {
        blocks.push_back(PassBlock{blocks.back().first + used, {}});
        used = 0;
      }
    }
  }
  return blocks;
}

int64_t block_rows_of(const PassBlock& b) {
  int64_t n = 0;
  for (const auto& s : b.seqs) n += s.count;
  return n;
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
      plan_(attn_res_plan(config_)),
      pass_plan_(parts.pass_plan) {
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
  PassArena arena;
  const LayerContext ctx{c, pool_ ? *pool_ : global_pool(), rows.seqs, R, &arena};
  const kernels::OffloadScope offload(offload_.get());  // null: every product on the CPU
  const Predictor predictor(*this, ctx);
  for (auto& s : rows.seqs) s.state->set_consistent(false);  // until the pass completes

  AttnResidual res(R, H, c.rms_eps, ctx.pool);
  const TapCapture taps(rows.seqs, H);
  trunk_->embed(rows.tokens, res.partial());  // p = h0, decoded from BF16 exactly
  const std::vector<PassBlock> blocks = split_blocks(rows, pass_plan_.block_rows);
  std::vector<LayerContext> bctx;
  int64_t most = 0;
  for (const auto& b : blocks) {
    bctx.push_back(LayerContext{c, ctx.pool, b.seqs, block_rows_of(b), &arena});
    most = std::max(most, bctx.back().rows);
  }
  std::vector<float> a(static_cast<size_t>(most * H)), u(a.size()), y(a.size());
  // a = MIX(score) and u = RMSNorm(a) for block j.
  auto mix_norm = [&](const std::vector<float>& score, const std::vector<float>& norm, size_t j) {
    res.mix(score, blocks[j].first, bctx[j].rows, a.data());
    rmsnorm_rows(a.data(), norm, c.rms_eps, bctx[j].rows, H, u.data());
  };
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerLease w(*trunk_, i);
    if (plan_[static_cast<size_t>(i)].bank) res.bank();  // the raw incoming partial
    for (size_t j = 0; j < blocks.size(); ++j) {
      mix_norm(w->attn_res_score, w->input_norm, j);
      if (i > 0) taps.take(i - 1, TapStream::kMixture, a.data(), blocks[j].first, bctx[j].rows);
      if (c.is_mla(i)) {
        mla_forward(bctx[j], w->mla, i, u.data(), y.data());
      } else {
        kda_forward(bctx[j], w->kda, i, u.data(), y.data());
      }
      res.add(blocks[j].first, bctx[j].rows, y.data());
    }
    res.end_add();
    // The MLP side (anchors are never empty here). Prediction only runs on passes of a few rows,
    // which are one block, so `a` then holds the whole pass's mix.
    if (c.is_dense(i)) {
      for (size_t j = 0; j < blocks.size(); ++j) {
        mix_norm(w->mlp_res_score, w->post_norm, j);
        if (j == 0) predictor.prefetch_after(i, a.data());
        mlp_forward(bctx[j], w->dense, u.data(), y.data(), false);
        res.add(blocks[j].first, bctx[j].rows, y.data());
      }
    } else {
      MoePass moe(ctx, w->moe, pass_plan_.block_rows);
      for (size_t j = 0; j < blocks.size(); ++j) {
        mix_norm(w->mlp_res_score, w->post_norm, j);
        moe.route(bctx[j], blocks[j].first, u.data());
      }
      pass_stats_.expert_uses += R * c.moe.top_k;
      pass_stats_.expert_fetches +=
          moe.run_experts(*experts_, i, [&] { predictor.prefetch_after(i, a.data()); });
      for (size_t j = 0; j < blocks.size(); ++j) {
        if (blocks.size() > 1) mix_norm(w->mlp_res_score, w->post_norm, j);  // else still in u
        moe.finish(bctx[j], blocks[j].first, u.data(), y.data());
        res.add(blocks[j].first, bctx[j].rows, y.data());
      }
    }
    res.end_add();
    taps.take(i, TapStream::kPartial, res.partial());
  }

  std::vector<float> logits = head_logits(*trunk_, ctx, res, rows.logit_rows);
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
