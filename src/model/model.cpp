// The decoder loop with Attention Residuals (K3-SPEC §3.3) over a batch of rows, and loading.
#include "model/model.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "model/layers.h"
#include "model/ops.h"
#include "model/streaming_trunk.h"

namespace deltafin {

namespace {

// MIX(cands, score): softmax over candidates of (score · c_j / rms(c_j)), applied to the raw
// candidates. `cands` are [R][H] buffers (anchors, then the live partial). Writes `out`.
void attn_res_mix(const std::vector<const float*>& cands, const std::vector<float>& score,
                  float eps, int64_t R, int64_t H, ThreadPool& pool, float* out) {
  const size_t n = cands.size();
  pool.parallel_for(R, 1, [&](int64_t b, int64_t e, int) {
    std::vector<float> s(n);
    for (int64_t r = b; r < e; ++r) {
      float mx = -INFINITY;
      for (size_t j = 0; j < n; ++j) {
        const float* cr = cands[j] + r * H;
        double d = 0.0;
        for (int64_t i = 0; i < H; ++i)
          d += static_cast<double>(cr[i]) * score[static_cast<size_t>(i)];
        s[j] = static_cast<float>(d) * ops::inv_rms(cr, H, eps);
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

// Passes with more rows than this skip routing prediction: their union covers most experts.
constexpr int64_t kMaxPredictRows = 16;

void rmsnorm_rows(const float* x, const std::vector<float>& w, float eps, int64_t R, int64_t H,
                  float* out) {
  for (int64_t r = 0; r < R; ++r) ops::rmsnorm(x + r * H, w.data(), eps, H, out + r * H);
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

Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& dir, const LoadOptions& options) {
  auto m = std::unique_ptr<Model>(new Model());
  m->config_ = load_config(dir);
  m->checkpoint_ = Checkpoint::open(dir);
  m->inventory_ = check_inventory(m->config_, *m->checkpoint_);
  m->plan_ = attn_res_plan(m->config_);
  if (options.threads >= 0) m->pool_ = std::make_unique<ThreadPool>(options.threads);
  const ModelConfig& c = m->config_;
  const ExpertFormat ef = m->inventory_.expert_format;
  if (options.mmap) {
    m->trunk_ = std::make_unique<ResidentTrunk>(c, *m->checkpoint_, options.bind);
  } else {
    PlanOptions po = options.plan;
    po.prefetch = options.prefetch;
    if (c.num_moe_layers() > 0)
      po.expert_slot_bytes =
          ExpertStore::slot_bytes_for(ExpertDirectory(c, *m->checkpoint_, ef), c);
    m->plan_mem_ = plan_memory(c, *m->checkpoint_, po);
    if (options.print_plan) fmt::print(stderr, "{}\n", m->plan_mem_->describe());
    m->trunk_ = std::make_unique<StreamingTrunk>(c, *m->checkpoint_, *m->plan_mem_, options.bind,
                                                 options.readers, options.direct_io);
  }
  if (options.make_experts) {
    m->experts_ = options.make_experts(c, *m->checkpoint_, ef);
  } else if (options.mmap || c.num_moe_layers() == 0) {
    m->experts_ = std::make_unique<MmapExpertProvider>(c, *m->checkpoint_, ef);
  } else {
    StoreOptions so;
    so.cache_bytes = m->plan_mem_->expert_cache_bytes;
    so.readers = options.readers;
    so.direct_io = options.direct_io;
    so.policy = options.cache_policy;
    so.heat_file = options.heat_file;
    auto store = std::make_unique<ExpertStore>(c, *m->checkpoint_, ef, so);
    store->set_prefetch(options.prefetch);
    m->experts_ = std::move(store);
  }
  if (m->config_.num_moe_layers() > 0) {
    m->expert_bytes_ = m->experts_->locate(static_cast<int>(m->config_.first_k_dense), 0).bytes;
  }
  return m;
}

std::string Model::describe() const {
  return fmt::format("trunk: {}; experts: {}", trunk_->describe(), experts_->describe());
}

std::vector<LayerRecall> Model::prefetch_recall() const {
  if (auto* s = dynamic_cast<const ExpertStore*>(experts_.get())) return s->recall();
  return {};
}

uint64_t Model::trunk_bytes_per_pass() const {
  uint64_t n = 0;
  for (int i = 0; i < config_.num_layers; ++i) n += layer_trunk_bytes(config_, i, *checkpoint_);
  const int64_t H = config_.hidden;
  n += static_cast<uint64_t>(config_.vocab * H * 2);  // lm_head
  n += static_cast<uint64_t>(H * 2);                  // one embedding row
  return n;
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
  const ModelConfig& c = config_;
  const int64_t H = c.hidden, V = c.vocab;
  ThreadPool& pool = pool_ ? *pool_ : global_pool();

  // Rows, grouped by sequence.
  std::vector<SeqRows> rows;
  std::vector<int32_t> tokens;
  for (auto& s : seqs) {
    if (s.state == nullptr || s.tokens.empty())
      fail("forward: every sequence needs a state and at least one token");
    if (s.state->kda().size() != static_cast<size_t>(c.num_kda_layers()) ||
        s.state->mla().size() != static_cast<size_t>(c.num_mla_layers())) {
      fail("forward: state was made for a different model");
    }
    for (const auto& r : rows) {
      if (r.state == s.state) fail("forward: the same state appears twice in one pass");
    }
    if (!s.state->consistent())
      fail("forward: the state was left half-updated by a failed pass; reset it first");
    SeqRows r;
    r.begin = static_cast<int64_t>(tokens.size());
    r.count = static_cast<int64_t>(s.tokens.size());
    r.state = s.state;
    r.pending = s.pending;
    r.base = s.state->position();
    if (r.base + r.count > c.max_positions) {
      fail("sequence of {} tokens exceeds the model's context of {} positions", r.base + r.count,
           c.max_positions);
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= V) fail("token id {} is outside the vocabulary (0..{})", t, V - 1);
      tokens.push_back(t);
    }
    if (s.pending != nullptr) {
      const int64_t nh = c.kda.num_heads, dk = c.kda.head_dim, T = r.count;
      s.pending->base_position = r.base;
      s.pending->rows = T;
      s.pending->layers.assign(static_cast<size_t>(c.num_kda_layers()), {});
      for (auto& l : s.pending->layers) {
        l.k.resize(static_cast<size_t>(T * nh * dk));
        l.v.resize(static_cast<size_t>(T * nh * dk));
        l.alpha.resize(static_cast<size_t>(T * nh * dk));
        l.beta.resize(static_cast<size_t>(T * nh));
      }
    }
    rows.push_back(r);
  }
  const int64_t R = static_cast<int64_t>(tokens.size());
  LayerContext ctx{c, pool, rows, R};
  // Until the pass completes, the states are half-updated.
  for (auto& r : rows) r.state->set_consistent(false);
  struct Release {  // gives a trunk unit back even when the layer throws
    TrunkProvider& t;
    int unit;
    ~Release() { unit < 0 ? t.release_head() : t.release(unit); }
  };

  // h0: embedding rows, decoded from BF16 exactly.
  std::vector<float> p(static_cast<size_t>(R * H));
  trunk_->embed(tokens, p.data());
  bool p_empty = false;
  std::vector<std::vector<float>> anchors;
  std::vector<float> a(static_cast<size_t>(R * H)), u(static_cast<size_t>(R * H)),
      y(static_cast<size_t>(R * H));
  auto candidates = [&]() {
    std::vector<const float*> v;
    for (const auto& an : anchors) v.push_back(an.data());
    v.push_back(p.data());
    return v;
  };

  // Routing prediction for the expert store: the next layer's router applied to this layer's
  // MLP-side input, read ahead while this layer computes. It only schedules reads.
  const bool predict = experts_->wants_prefetch() && R <= kMaxPredictRows;
  auto predict_next = [&](int i) {
    const int nxt = i + 1;
    if (!predict || nxt >= c.num_layers || c.is_dense(nxt)) return;
    const RouterWeights* rw = trunk_->router(nxt);
    if (rw == nullptr) return;
    std::vector<float> un(static_cast<size_t>(R * H)),
        lg(static_cast<size_t>(R * c.moe.num_experts));
    rmsnorm_rows(a.data(), rw->post_norm, c.rms_eps, R, H, un.data());
    kernels::matmul(rw->router, un.data(), R, H, lg.data(), c.moe.num_experts, pool);
    std::vector<int> ids(static_cast<size_t>(c.moe.top_k));
    std::vector<float> w(static_cast<size_t>(c.moe.top_k));
    std::vector<char> chosen(static_cast<size_t>(c.moe.num_experts), 0);
    for (int64_t r = 0; r < R; ++r) {
      route_row(lg.data() + r * c.moe.num_experts, rw->score_bias.data(), c.moe.num_experts,
                c.moe.top_k, c.moe.renormalize, c.moe.routed_scaling_factor, ids.data(), w.data());
      for (int e : ids) chosen[static_cast<size_t>(e)] = 1;
    }
    std::vector<int> want;
    for (int e = 0; e < c.moe.num_experts; ++e) {
      if (chosen[static_cast<size_t>(e)]) want.push_back(e);
    }
    experts_->prefetch(nxt, want);
  };

  for (int i = 0; i < c.num_layers; ++i) {
    const LayerWeights& lw = trunk_->acquire(i);
    Release release{*trunk_, i};
    // Attention-side input: the mixture of anchors and the partial (just the partial at first).
    if (anchors.empty()) {
      a = p;
    } else {
      attn_res_mix(candidates(), lw.attn_res_score, c.rms_eps, R, H, pool, a.data());
    }
    if (plan_[static_cast<size_t>(i)].bank) {  // bank the raw incoming partial, then reset it
      anchors.push_back(std::move(p));
      p.assign(static_cast<size_t>(R * H), 0.0f);
      p_empty = true;
    }
    rmsnorm_rows(a.data(), lw.input_norm, c.rms_eps, R, H, u.data());
    if (c.is_mla(i)) {
      mla_forward(ctx, lw.mla, i, u.data(), y.data());
    } else {
      kda_forward(ctx, lw.kda, i, u.data(), y.data());
    }
    if (p_empty) {
      p.swap(y);
      y.resize(static_cast<size_t>(R * H));
      p_empty = false;
    } else {
      for (size_t j = 0; j < p.size(); ++j) p[j] += y[j];
    }
    attn_res_mix(candidates(), lw.mlp_res_score, c.rms_eps, R, H, pool, a.data());
    rmsnorm_rows(a.data(), lw.post_norm, c.rms_eps, R, H, u.data());
    if (c.is_dense(i)) {
      predict_next(i);
      mlp_forward(ctx, lw.dense, u.data(), y.data(), false);
    } else {
      moe_forward(ctx, lw.moe, *experts_, i, u.data(), y.data(), pass_stats_,
                  [&] { predict_next(i); });
    }
    for (size_t j = 0; j < p.size(); ++j) p[j] += y[j];
  }

  // Output mixture over every anchor and the final partial, final norm, LM head on the rows
  // whose logits are wanted.
  std::vector<int64_t> out_rows;
  for (size_t s = 0; s < rows.size(); ++s) {
    if (seqs[s].all_logits) {
      for (int64_t t = 0; t < rows[s].count; ++t) out_rows.push_back(rows[s].begin + t);
    } else {
      out_rows.push_back(rows[s].begin + rows[s].count - 1);
    }
  }
  const HeadWeights& g = trunk_->acquire_head();
  Release release_head{*trunk_, -1};
  attn_res_mix(candidates(), g.out_res_score, c.rms_eps, R, H, pool, a.data());
  const int64_t n_out = static_cast<int64_t>(out_rows.size());
  std::vector<float> normed(static_cast<size_t>(n_out * H));
  for (int64_t j = 0; j < n_out; ++j) {
    ops::rmsnorm(a.data() + out_rows[static_cast<size_t>(j)] * H, g.final_norm.data(), c.rms_eps, H,
                 normed.data() + j * H);
  }
  std::vector<float> logits(static_cast<size_t>(n_out * V));
  kernels::matmul(g.lm_head, normed.data(), n_out, H, logits.data(), V, pool);

  for (auto& r : rows) {
    r.state->set_position(r.base + r.count);
    r.state->set_consistent(true);
  }
  pass_stats_.passes++;
  pass_stats_.rows += R;
  pass_stats_.seconds += sw.elapsed();
  return logits;
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
  state.truncate(pending.base_position + accepted);
}

}  // namespace deltafin
