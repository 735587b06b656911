// Unit tests of the K3 layers and the forward pass's guarantees (docs/MODEL.md §7's list): router
// selection vs weighting, AttnRes anchor counts, per-head A_log, chunked vs stepwise KDA,
// absorbed vs expanded MLA and the latent-norm epsilon, batching several sequences, state
// snapshot / restore / deferred commit, the routed-expert step's seam (the order a provider runs
// experts in never shows) and the model folder's includes (math only: no scheduling, I/O or GPU).
#include "model/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "fixtures/synthetic.h"
#include "kernels/kernels.h"
#include "model/layers.h"
#include "model/ops.h"
#include "model/released.h"
#include "storage/expert_directory.h"
#include "test_util.h"

namespace deltafin {
namespace {

std::string golden_model(const char* name) {
  return test::data_dir() + "/" + name + "/model";
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

// SiTU over rows (the kernels' vector tanh and exp) against the formula in double precision, and,
// on the scalar table, bit for bit against ops::situ: the same operations in the same order.
TEST(Situ, RowsFollowTheFormulaOnEveryTable) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-40.0f, 40.0f);
  std::vector<float> g(1000), u(1000);
  for (size_t i = 0; i < g.size(); ++i) g[i] = d(rng), u[i] = d(rng);
  for (float v : {0.0f, -0.0f, 1e-20f, -1e-20f, 90.0f, -90.0f, 200.0f, -200.0f}) {
    g.push_back(v), u.push_back(1.5f);
    g.push_back(0.75f), u.push_back(v);
  }
  const float beta = 4.0f, lbeta = 25.0f;
  const std::string before = kernels::active().name;
  for (const char* name : {"scalar", "avx2", "avx512", "neon"}) {
    try {
      kernels::select(name);
    } catch (const Error&) {
      continue;  // not on this CPU
    }
    std::vector<float> out(g.size());
    ops::situ_rows(g.data(), u.data(), static_cast<int64_t>(g.size()), beta, lbeta, out.data());
    for (size_t i = 0; i < g.size(); ++i) {
      const double gd = g[i], ud = u[i];
      const double ref =
          beta * std::tanh(gd / beta) / (1.0 + std::exp(-gd)) * lbeta * std::tanh(ud / lbeta);
      EXPECT_NEAR(out[i], ref, 2e-6 * std::fabs(ref) + 1e-37)
          << name << ": situ(" << g[i] << ", " << u[i] << ")";
      if (std::string(name) == "scalar") {
        EXPECT_EQ(out[i], ops::situ(g[i], u[i], beta, lbeta))
            << "situ(" << g[i] << ", " << u[i] << ")";
      }
    }
    // In place over g, as the MoE calls it.
    std::vector<float> gi = g;
    ops::situ_rows(gi.data(), u.data(), static_cast<int64_t>(g.size()), beta, lbeta, gi.data());
    EXPECT_EQ(gi, out) << name;
  }
  kernels::select(before.c_str());
}

TEST(Router, BiasChangesSelectionNotWeights) {
  // scores sigmoid(l); bias lifts expert 0 into the top 2 although its score is lowest.
  const float logits[4] = {-2.0f, 1.0f, 0.5f, 0.0f};
  const float bias[4] = {1.5f, 0.0f, 0.0f, 0.0f};
  int ids[2];
  float w[2];
  route_row(logits, bias, 4, 2, true, 2.5f, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  auto sig = [](float x) { return 1.0f / (1.0f + std::exp(-x)); };
  const double s0 = sig(-2.0f), s1 = sig(1.0f);
  EXPECT_NEAR(w[0], s0 / (s0 + s1) * 2.5, 1e-6);  // unbiased score, renormalised, scaled
  EXPECT_NEAR(w[1], s1 / (s0 + s1) * 2.5, 1e-6);
  route_row(logits, bias, 4, 2, false, 1.0f, ids, w);
  EXPECT_NEAR(w[0], s0, 1e-6);
}

TEST(Router, TiesPreferLowerExpertId) {
  const float logits[5] = {0.3f, 0.7f, 0.7f, 0.7f, 0.1f};
  const float bias[5] = {0, 0, 0, 0, 0};
  int ids[2];
  float w[2];
  route_row(logits, bias, 5, 2, true, 1.0f, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_NEAR(w[0] + w[1], 1.0f, 1e-6);
}

TEST(AttnRes, AnchorCountsPerLayer) {
  ModelConfig c = parse_config(synthetic_config_json(synthetic_preset("tiny")), "tiny");
  auto plan = attn_res_plan(c);
  std::vector<int> before, after;
  for (const auto& s : plan) {
    before.push_back(s.anchors_before);
    after.push_back(s.anchors_after);
  }
  EXPECT_EQ(before, (std::vector<int>{0, 1, 1, 1, 2, 2, 2, 3, 3}));
  EXPECT_EQ(after, (std::vector<int>{1, 1, 1, 2, 2, 2, 3, 3, 3}));
  // Real K3: 93 layers, block 12 -> 8 anchors; the MLP side of layers 84..92 and the output mix
  // see 9 candidates (8 anchors + the partial).
  SyntheticSpec k3 = synthetic_preset("k3");
  k3.layers = 93;
  ModelConfig ck = parse_config(synthetic_config_json(k3), "k3");
  auto p3 = attn_res_plan(ck);
  EXPECT_EQ(p3.back().anchors_after + 1, 9);
  EXPECT_EQ(p3[84].anchors_before, 7);
  EXPECT_TRUE(p3[84].bank);
  EXPECT_EQ(p3[0].anchors_before, 0);
}

// --- KDA: chunked form vs the stepwise recurrence -------------------------------------------

class KdaChunk : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(KdaChunk, MatchesStepwiseOutputsAndState) {
  // Not a structured binding: clang 14 cannot capture those in the lambdas below.
  const int dk = std::get<0>(GetParam());
  const int T = std::get<1>(GetParam());
  const int64_t dv = dk;
  std::mt19937 rng(7 + dk * 131 + T);
  std::normal_distribution<float> n01(0, 1);
  std::uniform_real_distribution<float> z(-4, 4);
  std::vector<float> q(T * dk), k(T * dk), v(T * dv), alpha(T * dk), beta(T);
  auto l2 = [&](float* x, float scale) {
    double s = 0;
    for (int d = 0; d < dk; ++d) s += x[d] * x[d];
    for (int d = 0; d < dk; ++d) x[d] = static_cast<float>(x[d] / std::sqrt(s + 1e-6) * scale);
  };
  for (int t = 0; t < T; ++t) {
    for (int d = 0; d < dk; ++d) {
      q[t * dk + d] = n01(rng);
      k[t * dk + d] = n01(rng);
      v[t * dv + d] = n01(rng);
      alpha[t * dk + d] = std::exp(-5.0f / (1.0f + std::exp(-z(rng))));  // exp(-5 sigmoid(.))
    }
    l2(&q[t * dk], 1.0f / std::sqrt(static_cast<float>(dk)));
    l2(&k[t * dk], 1.0f);
    beta[t] = 1.0f / (1.0f + std::exp(-n01(rng)));
  }
  std::vector<float> S0(dk * dv);
  for (auto& x : S0) x = 0.1f * n01(rng);
  std::vector<float> S_step = S0, S_chunk = S0, o_step(T * dv), o_chunk(T * dv), e(dv);
  for (int t = 0; t < T; ++t) {
    kda_step_head(S_step.data(), dk, dv, &q[t * dk], &k[t * dk], &v[t * dv], &alpha[t * dk],
                  beta[t], e.data(), &o_step[t * dv]);
  }
  kda_chunk_head(S_chunk.data(), dk, dv, T, q.data(), k.data(), v.data(), alpha.data(), beta.data(),
                 dk, dk, 1, o_chunk.data(), dv);
  EXPECT_LT(max_abs_diff(o_step, o_chunk), 2e-5);
  EXPECT_LT(max_abs_diff(S_step, S_chunk), 2e-5);
}

INSTANTIATE_TEST_SUITE_P(Sizes, KdaChunk,
                         ::testing::Combine(::testing::Values(32, 128),
                                            ::testing::Values(1, 2, 5, 16, 37)));

// --- MLA: absorbed engine path vs an expanded float64 reference ---------------------------

struct MlaFixture {
  ModelConfig c;
  MlaWeights w;
  std::vector<std::vector<float>> store;
  std::mt19937 rng{11};

  Matrix mat(int64_t rows, int64_t cols, float std) {
    std::normal_distribution<float> n(0, std);
    store.emplace_back(rows * cols);
    for (auto& x : store.back()) x = n(rng);
    return {WeightFormat::kF32, rows, cols, store.back().data(), nullptr};
  }
  std::vector<float> vec(int64_t n, float base, float std) {
    std::normal_distribution<float> d(0, std);
    std::vector<float> v(n);
    for (auto& x : v) x = base + d(rng);
    return v;
  }
  // `latent_scale` small makes the latents' mean square comparable to the norm epsilon.
  explicit MlaFixture(float latent_scale) {
    c = parse_config(synthetic_config_json(synthetic_preset("tiny")), "tiny");
    const auto& m = c.mla;
    const int64_t H = c.hidden;
    w.q_a = mat(m.q_lora_rank, H, latent_scale);
    w.q_a_norm = vec(m.q_lora_rank, 1.0f, 0.1f);
    w.q_b = mat(m.num_heads * m.q_head_dim(), m.q_lora_rank, 0.2f);
    w.kv_a = mat(m.cache_width(), H, latent_scale);
    w.kv_a_norm = vec(m.kv_lora_rank, 1.0f, 0.1f);
    w.kv_b = mat(m.num_heads * (m.qk_nope_dim + m.v_head_dim), m.kv_lora_rank, 0.2f);
    w.g = mat(m.num_heads * m.v_head_dim, H, 0.1f);
    w.o = mat(H, m.num_heads * m.v_head_dim, 0.1f);
  }

  // Expanded-form reference in double for rows u[T][H] of one sequence starting empty.
  std::vector<double> reference(const std::vector<float>& u, int64_t T, double eps) const {
    const auto& m = c.mla;
    const int64_t H = c.hidden, nH = m.num_heads, dn = m.qk_nope_dim, dr = m.qk_rope_dim,
                  dv = m.v_head_dim;
    const int64_t dq = m.q_lora_rank, dc = m.kv_lora_rank;
    auto W = [](const Matrix& a, int64_t r, int64_t col) {
      return static_cast<const float*>(a.data)[r * a.cols + col];
    };
    auto rms = [&](std::vector<double>& x, const std::vector<float>& g) {
      double s = 0;
      for (double v : x) s += v * v;
      double inv = 1.0 / std::sqrt(s / x.size() + eps);
      for (size_t i = 0; i < x.size(); ++i) x[i] = g[i] * (x[i] * inv);
    };
    std::vector<std::vector<double>> Q(T), C(T), KPE(T), G(T);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> cq(dq, 0.0), ckv(dc, 0.0);
      for (int64_t i = 0; i < dq; ++i)
        for (int64_t j = 0; j < H; ++j) cq[i] += W(w.q_a, i, j) * u[t * H + j];
      rms(cq, w.q_a_norm);
      Q[t].assign(nH * (dn + dr), 0.0);
      for (int64_t i = 0; i < nH * (dn + dr); ++i)
        for (int64_t j = 0; j < dq; ++j) Q[t][i] += W(w.q_b, i, j) * cq[j];
      for (int64_t i = 0; i < dc; ++i)
        for (int64_t j = 0; j < H; ++j) ckv[i] += W(w.kv_a, i, j) * u[t * H + j];
      rms(ckv, w.kv_a_norm);
      C[t] = ckv;
      KPE[t].assign(dr, 0.0);
      for (int64_t i = 0; i < dr; ++i)
        for (int64_t j = 0; j < H; ++j) KPE[t][i] += W(w.kv_a, dc + i, j) * u[t * H + j];
      G[t].assign(nH * dv, 0.0);
      for (int64_t i = 0; i < nH * dv; ++i) {
        double s = 0;
        for (int64_t j = 0; j < H; ++j) s += W(w.g, i, j) * u[t * H + j];
        G[t][i] = 1.0 / (1.0 + std::exp(-s));
      }
    }
    std::vector<double> y(T * H, 0.0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> o(nH * dv, 0.0);
      for (int64_t h = 0; h < nH; ++h) {
        std::vector<double> sc(t + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double s = 0;
          for (int64_t d = 0; d < dn; ++d) {  // k_nope = W_kvb[h, d] · c_j
            double kn = 0;
            for (int64_t l = 0; l < dc; ++l) kn += W(w.kv_b, h * (dn + dv) + d, l) * C[j][l];
            s += Q[t][h * (dn + dr) + d] * kn;
          }
          for (int64_t d = 0; d < dr; ++d) s += Q[t][h * (dn + dr) + dn + d] * KPE[j][d];
          sc[j] = s / std::sqrt(static_cast<double>(dn + dr));
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (auto& s : sc) sum += (s = std::exp(s - mx));
        for (int64_t j = 0; j <= t; ++j) {
          for (int64_t d = 0; d < dv; ++d) {
            double vv = 0;
            for (int64_t l = 0; l < dc; ++l) vv += W(w.kv_b, h * (dn + dv) + dn + d, l) * C[j][l];
            o[h * dv + d] += sc[j] / sum * vv;
          }
        }
      }
      for (int64_t i = 0; i < nH * dv; ++i) o[i] *= G[t][i];
      for (int64_t i = 0; i < H; ++i)
        for (int64_t j = 0; j < nH * dv; ++j) y[t * H + i] += W(w.o, i, j) * o[j];
    }
    return y;
  }

  // The engine: prefill `split` rows, then one row per pass.
  std::vector<float> engine(const std::vector<float>& u, int64_t T, int64_t split) {
    ThreadPool pool(2);
    State st(c);
    std::vector<float> y(T * c.hidden);
    const int layer = 3;  // MLA in the tiny schedule
    int64_t done = 0;
    while (done < T) {
      int64_t n = done == 0 && split > 0 ? split : 1;
      SeqRows s{0, n, &st, nullptr, done};
      LayerContext ctx{c, pool, std::span<const SeqRows>(&s, 1), n};
      mla_forward(ctx, w, layer, u.data() + done * c.hidden, y.data() + done * c.hidden);
      done += n;
      st.set_position(done);
    }
    return y;
  }
};

double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return num / den;
}

TEST(Mla, AbsorbedMatchesExpandedInPrefillAndDecode) {
  MlaFixture f(0.05f);
  const int64_t T = 7;
  std::normal_distribution<float> n01(0, 1);
  std::vector<float> u(T * f.c.hidden);
  for (auto& x : u) x = n01(f.rng);
  auto ref = f.reference(u, T, 1e-6);
  EXPECT_LT(rel_err(f.engine(u, T, T), ref), 1e-4);
  EXPECT_LT(rel_err(f.engine(u, T, 3), ref), 1e-4);
  EXPECT_LT(rel_err(f.engine(u, T, 0), ref), 1e-4);
}

TEST(Mla, LatentNormsUseEpsilon1e6) {
  // Latents with a mean square near 1e-6: a 1e-5 epsilon changes the result visibly.
  MlaFixture f(6e-5f);
  const int64_t T = 4;
  std::normal_distribution<float> n01(0, 1);
  std::vector<float> u(T * f.c.hidden);
  for (auto& x : u) x = n01(f.rng);
  auto got = f.engine(u, T, T);
  EXPECT_LT(rel_err(got, f.reference(u, T, 1e-6)), 1e-3);
  EXPECT_GT(rel_err(got, f.reference(u, T, 1e-5)), 5e-2);
}

// --- Rows of several sequences, state snapshots and deferred commits ------------------------

TEST(Forward, BatchingSeveralSequencesMatchesSeparatePasses) {
  auto model = open_model(golden_model("k3-tiny-mxfp4"));
  std::vector<std::vector<int32_t>> prefix = {{}, {9, 8, 7}, {100}};
  std::vector<std::vector<int32_t>> now = {
      {5, 17, 200, 3, 99}, {42}, {7, 300, 64, 128, 1, 250, 77, 8}};
  std::vector<State> sep, bat;
  std::vector<std::vector<float>> expect;
  for (size_t i = 0; i < now.size(); ++i) {
    sep.push_back(model->new_state());
    bat.push_back(model->new_state());
    if (!prefix[i].empty()) {
      model->forward(sep[i], prefix[i]);
      model->forward(bat[i], prefix[i]);
    }
    expect.push_back(model->forward(sep[i], now[i], true));
  }
  std::vector<SequenceInput> in(now.size());
  for (size_t i = 0; i < now.size(); ++i) {
    in[i].state = &bat[i];
    in[i].tokens = now[i];
    in[i].all_logits = true;
  }
  auto got = model->forward(in);
  std::vector<float> flat;
  for (auto& e : expect) flat.insert(flat.end(), e.begin(), e.end());
  EXPECT_LT(max_abs_diff(flat, got), 1e-4);
  for (size_t i = 0; i < now.size(); ++i) EXPECT_EQ(bat[i].position(), sep[i].position());
}

TEST(Forward, SnapshotRestoreRepeatsExactly) {
  auto model = open_model(golden_model("k3-tiny-bf16"));
  State st = model->new_state();
  model->forward(st, std::vector<int32_t>{1, 2, 3, 4, 5});
  State snap = st.snapshot();
  auto a = model->forward(st, std::vector<int32_t>{6, 7, 8}, true);
  EXPECT_EQ(st.position(), 8);
  st.restore(snap);
  EXPECT_EQ(st.position(), 5);
  auto b = model->forward(st, std::vector<int32_t>{6, 7, 8}, true);
  EXPECT_EQ(a, b);
}

TEST(Forward, DeferredPassCommitsOnlyTheAcceptedPrefix) {
  auto model = open_model(golden_model("k3-tiny-mxfp4"));
  const std::vector<int32_t> prefix = {3, 1, 4, 1}, block = {5, 9, 2, 6, 5, 3, 5, 8},
                             after = {9, 7};
  for (int64_t accepted : {0, 3, 8}) {
    State plain = model->new_state(), spec = model->new_state();
    model->forward(plain, prefix);
    model->forward(spec, prefix);
    // Deferred pass over the whole block: its logits equal a normal pass's.
    PendingCommit pending;
    SequenceInput in;
    in.state = &spec;
    in.tokens = block;
    in.all_logits = true;
    in.pending = &pending;
    auto lv = model->forward(std::span<SequenceInput>(&in, 1));
    State probe = plain.snapshot();
    auto lp = model->forward(probe, block, true);
    EXPECT_LT(max_abs_diff(lv, lp), 1e-5);
    model->commit(spec, pending, accepted);
    EXPECT_EQ(spec.position(), static_cast<int64_t>(prefix.size()) + accepted);
    if (accepted > 0) model->forward(plain, std::span<const int32_t>(block.data(), accepted));
    // Continuing after the commit is exactly continuing after running only the accepted rows.
    auto x = model->forward(plain, after, true);
    auto y = model->forward(spec, after, true);
    EXPECT_EQ(x, y) << "accepted " << accepted;
  }
}

TEST(Forward, RejectsBadTokensAndReusedStates) {
  auto model = open_model(golden_model("k3-tiny-bf16"));
  State st = model->new_state();
  try {
    model->forward(st, std::vector<int32_t>{1, 512});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 512 is outside the vocabulary"),
              std::string::npos);
  }
  std::vector<int32_t> t = {1};
  SequenceInput in[2];
  in[0].state = in[1].state = &st;
  in[0].tokens = in[1].tokens = t;
  EXPECT_THROW(model->forward(std::span<SequenceInput>(in, 2)), Error);
}

// --- The seams: what the model hands over, and what it includes ---------------------------------

// An expert provider that carries out each routed-expert step in its own order: all the step's
// experts fetched first, then applied from the highest id down (the storage providers apply them
// as they arrive, the engine's DeviceExperts in device windows). It checks what the model hands
// over: distinct ascending ids, and every (row, slot) of the pass in exactly one expert's list.
class ReversedSteps : public ExpertProvider {
 public:
  explicit ReversedSteps(std::unique_ptr<ExpertProvider> inner) : inner_(std::move(inner)) {}
  void run(const ExpertStep& step) override {
    ++steps;
    std::vector<ExpertHandle> handles(step.experts.size());
    auto batch = inner_->request(step.layer, step.experts);
    if (step.issued) step.issued();
    size_t index = 0;
    ExpertHandle h;
    while (batch->next(index, h)) handles[index] = std::move(h);
    std::set<int64_t> seen;
    for (size_t i = 0; i < step.experts.size(); ++i) {
      if (i > 0) {
        EXPECT_LT(step.experts[i - 1], step.experts[i]);
      }
      for (int64_t u : step.users[static_cast<size_t>(step.experts[i])])
        EXPECT_TRUE(seen.insert(u).second) << "(row, slot) " << u << " given to two experts";
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), step.rows * step.top_k);
    for (size_t i = step.experts.size(); i-- > 0;)
      step.apply(*handles[i], step.users[static_cast<size_t>(step.experts[i])]);
  }
  uint64_t expert_bytes() const override { return inner_->expert_bytes(); }
  std::unique_ptr<ExpertBatch> request(int layer, std::span<const int> experts) override {
    return inner_->request(layer, experts);
  }
  ExpertHandle acquire(int layer, int expert) override { return inner_->acquire(layer, expert); }
  ExpertStats stats() const override { return inner_->stats(); }
  std::string describe() const override { return "reversed steps"; }

  int64_t steps = 0;

 private:
  std::unique_ptr<ExpertProvider> inner_;
};

TEST(Forward, TheOrderAProviderRunsExpertsInNeverShows) {
  for (const char* name : {"k3-tiny-mxfp4", "k3-tiny-bf16"}) {
    const std::string dir = golden_model(name);
    auto plain = open_model(dir);
    ReversedSteps* reversed = nullptr;
    auto model = open_model(
        test::engine_options(dir), {},
        [&](const ModelConfig& c, const Checkpoint& ck, ExpertFormat f) {
          auto p = std::make_unique<ReversedSteps>(std::make_unique<MmapExpertProvider>(c, ck, f));
          reversed = p.get();
          return p;
        });
    ASSERT_NE(reversed, nullptr);
    std::vector<int32_t> prompt(40);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 5) % 500);
    State a = plain->new_state(), b = model->new_state();
    EXPECT_EQ(plain->forward(a, prompt, true), model->forward(b, prompt, true)) << name;
    for (int32_t t : {7, 300, 64}) {
      const std::vector<int32_t> one = {t};
      EXPECT_EQ(plain->forward(a, one), model->forward(b, one)) << name;
    }
    // One step per MoE layer per pass: the model hands each layer pass's experts over once.
    const ModelConfig& c = model->config();
    int64_t moe_layers = 0;
    for (int64_t i = 0; i < c.num_layers; ++i) moe_layers += c.is_dense(i) ? 0 : 1;
    EXPECT_GT(moe_layers, 0);
    EXPECT_EQ(reversed->steps, model->pass_stats().passes * moe_layers) << name;
  }
}

// docs/ARCHITECTURE.md: the model folder holds the math and nothing that schedules it. Its
// project includes are the math's own layers (model, tensor, the kernels' products) and the
// core pieces a computation needs (errors, the compute threads, a pass's clock, JSON parsing of
// config.json, the allocation-fault test hook); no offload seam, device, storage, file or
// mapping header, and no system header for threads, locks, files or descriptors.
TEST(ModelSources, IncludeNoSchedulingIoOrGpuHeaders) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(test::data_dir()) / ".." / ".." / "src" / "model";
  const std::set<std::string> core_allowed = {"core/error.h", "core/thread_pool.h", "core/timer.h",
                                              "core/json_parse.h", "core/fault_inject.h",
                                              "kernels/kernels.h",
                                              // an enum's names: a constant table
                                              "core/enum_names.h",
                                              // spans: a clock read into memory, no I/O
                                              "core/trace.h"};
  const std::regex project(R"re(^\s*#\s*include\s*"([^"]+)")re");
  const std::regex system(
      R"re(^\s*#\s*include\s*<(thread|mutex|shared_mutex|condition_variable|future|fstream|iostream|filesystem|cstdio|fcntl\.h|unistd\.h|dlfcn\.h|sys/.*|vulkan/.*)>)re");
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string ext = e.path().extension().string();
    if (ext != ".cpp" && ext != ".h") continue;
    ++files;
    std::ifstream in(e.path());
    std::string line;
    const std::string file = "src/model/" + e.path().filename().string();
    for (int n = 1; std::getline(in, line); ++n) {
      std::smatch m;
      if (std::regex_search(line, m, project)) {
        const std::string h = m[1];
        const bool ok =
            h.rfind("model/", 0) == 0 || h.rfind("tensor/", 0) == 0 || core_allowed.count(h) > 0;
        EXPECT_TRUE(ok) << file << ":" << n << " includes " << h
                        << ": the model folder holds the math only (docs/ARCHITECTURE.md)";
      }
      EXPECT_FALSE(std::regex_search(line, system))
          << file << ":" << n
          << " includes a threads, locks, files or descriptors header: " << line;
    }
  }
  EXPECT_GT(files, 20);
}

// The released shapes doctor forecasts and make-model's presets shrink: parsed by the same parser
// as a checkpoint, with the releases' sizes (docs/MODEL.md §1, docs/FAMILY.md).
TEST(ReleasedModels, ParseToTheReleasesShapes) {
  const ModelConfig k3 = released_model("kimi-k3").config();
  EXPECT_EQ(k3.family, Family::kK3);
  EXPECT_EQ(k3.num_layers, 93);
  EXPECT_EQ(k3.num_mla_layers(), 24);
  EXPECT_EQ(k3.moe.num_experts, 896);
  EXPECT_EQ(k3.moe.top_k, 16);
  EXPECT_EQ(k3.expert_dim(), 3584);
  EXPECT_EQ(k3.expert_format(), ExpertFormat::kMXFP4);
  const ModelConfig kl = released_model("kimi-linear").config();
  EXPECT_EQ(kl.family, Family::kKimiLinear);
  EXPECT_EQ(kl.num_layers, 27);
  EXPECT_EQ(kl.num_mla_layers(), 7);
  EXPECT_EQ(kl.moe.num_experts, 256);
  EXPECT_FLOAT_EQ(kl.moe.routed_scaling_factor, 2.446f);
  EXPECT_EQ(kl.expert_format(), ExpertFormat::kBF16);
  // The presets keep the release's widths and shrink only layers, experts and vocabulary.
  const SyntheticSpec p = synthetic_preset("k3");
  EXPECT_EQ(p.hidden, k3.hidden);
  EXPECT_EQ(p.latent, k3.moe.latent_dim);
  EXPECT_EQ(p.layers, 4);
  try {
    released_model("kimi-k9");
    ADD_FAILURE() << "an unknown release was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("kimi-k3, kimi-linear"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deltafin
