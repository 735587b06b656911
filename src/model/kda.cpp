// Kimi Delta Attention (docs/MODEL.md §3.4): projections batched over all rows, then per sequence
// the causal short convolution (with its carried history) and, per head, the gated delta-rule
// recurrence run row by row. The stepwise recurrence is the oracle form: a sequence gives
// bit-identical KDA state whether its rows come in one pass or many, and the deferred-commit
// replay reproduces it exactly. Passes with many rows of one sequence (prompt prefill) use the
// chunked form instead (kda_chunk.cpp), which agrees to fp32 rounding and touches each head's
// state once per 16 rows instead of twice per row. The family's variants come from the config:
// the decay (K3's bounded lb·σ(exp(A_log)·z), Kimi-Linear's unbounded −exp(A_log)·softplus(z),
// docs/FAMILY.md KL.5) and the output gate (one g_proj, or g_b_proj · g_a_proj).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "model/layers.h"
#include "model/ops.h"

namespace deltafin {

// One recurrence step for one head. S is [dk][dv] (key rows), updated in place.
// Writes o = S_newᵀ q when o != nullptr.
void kda_step_head(float* S, int64_t dk, int64_t dv, const float* q, const float* k, const float* v,
                   const float* alpha, float beta, float* e, float* o) {
  const auto& K = kernels::active();
  // e = v - (diag(alpha) S)ᵀ k, decaying S on the way.
  std::memcpy(e, v, static_cast<size_t>(dv) * sizeof(float));
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dv;
    const float a = alpha[i];
    for (int64_t j = 0; j < dv; ++j) row[j] *= a;
    K.axpy(-k[i], row, e, dv);
  }
  // S += beta k eᵀ ; o = Sᵀ q
  if (o != nullptr) std::memset(o, 0, static_cast<size_t>(dv) * sizeof(float));
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dv;
    K.axpy(beta * k[i], e, row, dv);
    if (o != nullptr) K.axpy(q[i], row, o, dv);
  }
}

namespace {
constexpr int64_t kChunkRows = 16;
}

void kda_forward(const LayerContext& ctx, const KdaWeights& w, int layer, const float* u,
                 float* y) {
  const ModelConfig& c = ctx.c;
  const int64_t R = ctx.rows, H = c.hidden;
  const int64_t nh = c.kda.num_heads, dk = c.kda.head_dim, Pk = c.kda.proj_dim();
  const int64_t Kc = c.kda.conv_kernel, hist = Kc - 1, W3 = 3 * Pk;
  const int64_t rank = w.f_a.rows;
  ThreadPool& pool = ctx.pool;

  // Every buffer below is written whole before it is read (the arena's are uninitialised).
  PassArena own;
  PassArena& arena = ctx.arena != nullptr ? *ctx.arena : own;
  arena.reset();
  // Projections: pre-conv q | k | v per row (the layout of the conv history), gate, decay, beta.
  float* qkv = arena.take(R * W3);
  kernels::matmul(w.q, u, R, H, qkv, W3, pool);
  kernels::matmul(w.k, u, R, H, qkv + Pk, W3, pool);
  kernels::matmul(w.v, u, R, H, qkv + 2 * Pk, W3, pool);
  float* gate = arena.take(R * Pk);
  if (w.g_a.valid()) {  // the low-rank output gate
    float* ga = arena.take(R * w.g_a.rows);
    kernels::matmul(w.g_a, u, R, H, ga, w.g_a.rows, pool);
    kernels::matmul(w.g, ga, R, w.g_a.rows, gate, Pk, pool);
  } else {
    kernels::matmul(w.g, u, R, H, gate, Pk, pool);
  }
  float* fa = arena.take(R * rank);
  kernels::matmul(w.f_a, u, R, H, fa, rank, pool);
  float* z = arena.take(R * Pk);
  kernels::matmul(w.f_b, fa, R, rank, z, Pk, pool);
  float* bl = arena.take(R * nh);
  kernels::matmul(w.b, u, R, H, bl, nh, pool);

  // Short causal depthwise conv + SiLU, per sequence, over [history ; new rows].
  float* act = arena.take(R * W3);
  for (const SeqRows& s : ctx.seqs) {
    KdaLayerState& st = s.state->kda()[static_cast<size_t>(s.state->kda_slot(layer))];
    const float* hrows = st.conv.data();                // [hist][W3]
    auto input = [&](int64_t t, int64_t ch) -> float {  // t relative to the sequence's first row
      if (t >= 0) return qkv[(s.begin + t) * W3 + ch];
      return hrows[static_cast<size_t>((hist + t) * W3 + ch)];
    };
    pool.parallel_for(W3, 256, [&](int64_t c0, int64_t c1, int) {
      for (int64_t ch = c0; ch < c1; ++ch) {
        const float* taps = (ch < Pk       ? w.q_conv.data() + ch * Kc
                             : ch < 2 * Pk ? w.k_conv.data() + (ch - Pk) * Kc
                                           : w.v_conv.data() + (ch - 2 * Pk) * Kc);
        for (int64_t t = 0; t < s.count; ++t) {
          float acc = 0.0f;
          for (int64_t j = 0; j < Kc; ++j) acc += taps[j] * input(t - hist + j, ch);
          act[(s.begin + t) * W3 + ch] = ops::silu(acc);
        }
      }
    });
    if (s.pending != nullptr) {
      auto& rec = s.pending->layers[static_cast<size_t>(s.state->kda_slot(layer))];
      rec.conv_in.assign(qkv + s.begin * W3, qkv + (s.begin + s.count) * W3);
    } else if (hist > 0) {
      // New history = the last `hist` inputs of [history ; new rows].
      std::vector<float> nh_rows(static_cast<size_t>(hist * W3));
      for (int64_t r = 0; r < hist; ++r) {
        const int64_t t = s.count - hist + r;
        for (int64_t ch = 0; ch < W3; ++ch)
          nh_rows[static_cast<size_t>(r * W3 + ch)] = input(t, ch);
      }
      st.conv.swap(nh_rows);
    }
  }

  // Per row and head: L2-normalised q (scaled by dk^-1/2) and k, decay alpha, beta.
  float* alpha = arena.take(R * Pk);
  float* beta = arena.take(R * nh);
  const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
  const float lb = c.kda.gate_lower_bound;
  const bool softplus_decay = c.kda.decay == KdaDecay::kSoftplus;
  pool.parallel_for(R * nh, 16, [&](int64_t b, int64_t e, int) {
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t r = idx / nh, h = idx % nh;
      float* q = act + r * W3 + h * dk;
      float* k = q + Pk;
      double sq = 0, sk = 0;
      for (int64_t d = 0; d < dk; ++d) {
        sq += static_cast<double>(q[d]) * q[d];
        sk += static_cast<double>(k[d]) * k[d];
      }
      // L2 norm with 1e-6 inside the root (FLA's kernel, §3.1), not max(‖v‖, eps).
      const float iq = static_cast<float>(1.0 / std::sqrt(sq + 1e-6)) * qscale;
      const float ik = static_cast<float>(1.0 / std::sqrt(sk + 1e-6));
      for (int64_t d = 0; d < dk; ++d) {
        q[d] *= iq;
        k[d] *= ik;
      }
      const float ae = w.a_exp[static_cast<size_t>(h)];
      if (softplus_decay) {
        // g = −exp(A_log)·softplus(z): no lower bound, α may underflow to 0 (it just forgets).
        for (int64_t d = 0; d < dk; ++d) {
          const int64_t ch = h * dk + d;
          const float zz = z[r * Pk + ch] + w.dt_bias[static_cast<size_t>(ch)];
          alpha[r * Pk + ch] = std::exp(-ae * ops::softplus(zz));
        }
      } else {
        for (int64_t d = 0; d < dk; ++d) {
          const int64_t ch = h * dk + d;
          const float zz = z[r * Pk + ch] + w.dt_bias[static_cast<size_t>(ch)];
          // The lower bound scales the sigmoid (g ∈ (lb, 0)); it is not a clamp on g.
          alpha[r * Pk + ch] = std::exp(lb * ops::sigmoid(ae * zz));
        }
      }
      beta[r * nh + h] = ops::sigmoid(bl[r * nh + h]);
    }
  });

  // The recurrence, one task per (sequence, head).
  float* o = arena.take(R * Pk);
  const int64_t n_tasks = static_cast<int64_t>(ctx.seqs.size()) * nh;
  pool.run(static_cast<int>(n_tasks), [&](int task, int) {
    const SeqRows& s = ctx.seqs[static_cast<size_t>(task / nh)];
    const int64_t h = task % nh;
    const int slot = s.state->kda_slot(layer);
    KdaLayerState& st = s.state->kda()[static_cast<size_t>(slot)];
    float* S = st.S.data() + h * dk * dk;
    std::vector<float> scratch, e(static_cast<size_t>(dk));
    KdaLayerRecord* rec = nullptr;
    if (s.pending != nullptr) {  // leave the committed state untouched
      scratch.assign(S, S + dk * dk);
      S = scratch.data();
      rec = &s.pending->layers[static_cast<size_t>(slot)];
    }
    // Long prefill: the chunked form, chosen by the sequence's rows in the whole pass so a pass
    // computed in blocks (pass_plan.h) runs the same recurrence as one that is not.
    if (rec == nullptr && std::max(s.count, s.pass_count) >= kChunkRows) {
      const float* q0 = act + s.begin * W3 + h * dk;
      kda_chunk_head(S, dk, dk, s.count, q0, q0 + Pk, q0 + 2 * Pk, alpha + s.begin * Pk + h * dk,
                     beta + s.begin * nh + h, W3, Pk, nh, o + s.begin * Pk + h * dk, Pk);
      return;
    }
    for (int64_t t = 0; t < s.count; ++t) {
      const int64_t r = s.begin + t;
      const float* q = act + r * W3 + h * dk;
      const float* k = q + Pk;
      const float* v = q + 2 * Pk;
      const float* a = alpha + r * Pk + h * dk;
      const float b = beta[r * nh + h];
      kda_step_head(S, dk, dk, q, k, v, a, b, e.data(), o + r * Pk + h * dk);
      if (rec != nullptr) {
        const size_t off = static_cast<size_t>((t * nh + h) * dk);
        std::copy(k, k + dk, rec->k.begin() + off);
        std::copy(v, v + dk, rec->v.begin() + off);
        std::copy(a, a + dk, rec->alpha.begin() + off);
        rec->beta[static_cast<size_t>(t * nh + h)] = b;
      }
    }
  });

  // Gated output norm per head, then the output projection.
  const float eps = c.rms_eps;  // o_norm uses the config's 1e-5 like the other norms (§3.1)
  pool.parallel_for(R * nh, 16, [&](int64_t b, int64_t e, int) {
    for (int64_t idx = b; idx < e; ++idx) {
      float* oh = o + idx * dk;  // rows are [nh][dk], so (r, h) is idx
      const float* gh = gate + idx * dk;
      ops::rmsnorm(oh, w.o_norm.data(), eps, dk, oh);
      for (int64_t d = 0; d < dk; ++d) oh[d] *= ops::sigmoid(gh[d]);
    }
  });
  kernels::matmul(w.o, o, R, Pk, y, H, pool);
}

void kda_begin_pending(const ModelConfig& c, int64_t base, int64_t rows, PendingCommit& pending) {
  const size_t n = static_cast<size_t>(rows * c.kda.num_heads * c.kda.head_dim);
  pending.base_position = base;
  pending.rows = rows;
  pending.layers.assign(static_cast<size_t>(c.num_kda_layers()), {});
  for (auto& l : pending.layers) {
    l.k.resize(n);
    l.v.resize(n);
    l.alpha.resize(n);
    l.beta.resize(static_cast<size_t>(rows * c.kda.num_heads));
  }
}

void kda_commit(const ModelConfig& c, const KdaLayerRecord& rec, int64_t rows, int64_t accepted,
                KdaLayerState& st) {
  const int64_t nh = c.kda.num_heads, dk = c.kda.head_dim, Pk = c.kda.proj_dim();
  const int64_t hist = c.kda.conv_kernel - 1, W3 = 3 * Pk;
  std::vector<float> e(static_cast<size_t>(dk));
  for (int64_t h = 0; h < nh; ++h) {
    float* S = st.S.data() + h * dk * dk;
    for (int64_t t = 0; t < accepted; ++t) {
      const size_t off = static_cast<size_t>((t * nh + h) * dk);
      kda_step_head(S, dk, dk, nullptr, rec.k.data() + off, rec.v.data() + off,
                    rec.alpha.data() + off, rec.beta[static_cast<size_t>(t * nh + h)], e.data(),
                    nullptr);
    }
  }
  (void)rows;
  if (hist > 0 && accepted > 0) {
    std::vector<float> all(st.conv);
    all.insert(all.end(), rec.conv_in.begin(), rec.conv_in.begin() + accepted * W3);
    st.conv.assign(all.end() - hist * W3, all.end());
  }
}

}  // namespace deltafin
