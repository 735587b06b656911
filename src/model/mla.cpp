// Multi-head latent attention (docs/MODEL.md §3.6) in the absorbed form: the cache holds one
// latent row per position (the normed kv_lora latent c and the shared k_pe slice); each head's
// query is mapped into latent space (q̃ = Wk_hᵀ q_nope), scored against [c | k_pe] with scale
// 1/sqrt(nope + rope), the softmax-weighted latent is mapped out by Wv_h, gated by
// sigmoid(g_proj u) where the config has K3's output gate, and projected. The query is K3's
// low-rank q_b(norm(q_a u)) or Kimi-Linear's one q_proj (FAMILY.md KL.6). K3 and Kimi-Linear are
// NoPE (k_pe and q_pe are never rotated); DeepSeek-V3 / Kimi K2 rotate both with YaRN RoPE at the
// row's position where they are formed (rope.h), so the cache keeps the rotated k_pe and the
// absorbed form is unchanged (RoPE touches only the pe slice), and the softmax scale carries
// YaRN's mscale² (FAMILY.md §RoPE). Prefill and decode share this path.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "model/latent_attention.h"
#include "model/layers.h"
#include "model/ops.h"
#include "model/rope.h"

namespace deltafin {

void mla_forward(const LayerContext& ctx, const MlaWeights& w, int layer, const float* u,
                 float* y) {
  const ModelConfig& c = ctx.c;
  const auto& m = c.mla;
  const int64_t R = ctx.rows, H = c.hidden;
  const int64_t nH = m.num_heads, dq = m.q_lora_rank, dc = m.kv_lora_rank;
  const int64_t dn = m.qk_nope_dim, dr = m.qk_rope_dim, dv = m.v_head_dim;
  const int64_t qw = nH * (dn + dr), cw = dc + dr, kvb_stride = dn + dv;
  ThreadPool& pool = ctx.pool;
  const float kLatentEps = m.latent_eps;  // q_a_layernorm / kv_a_layernorm: the class default

  std::vector<float> q(static_cast<size_t>(R * qw));
  if (dq > 0) {
    std::vector<float> cq(static_cast<size_t>(R * dq));
    kernels::matmul(w.q_a, u, R, H, cq.data(), dq, pool);
    for (int64_t r = 0; r < R; ++r) {
      ops::rmsnorm(cq.data() + r * dq, w.q_a_norm.data(), kLatentEps, dq, cq.data() + r * dq);
    }
    kernels::matmul(w.q_b, cq.data(), R, dq, q.data(), qw, pool);
  } else {
    kernels::matmul(w.q, u, R, H, q.data(), qw, pool);
  }
  std::vector<float> ckv(static_cast<size_t>(R * cw));
  kernels::matmul(w.kv_a, u, R, H, ckv.data(), cw, pool);
  for (int64_t r = 0; r < R; ++r) {
    ops::rmsnorm(ckv.data() + r * cw, w.kv_a_norm.data(), kLatentEps, dc, ckv.data() + r * cw);
  }
  if (m.rope.enabled) {
    // q_pe of every head and the shared k_pe, rotated at each row's position (one table per row).
    const Rope rope(m.rope, dr);
    for (const SeqRows& s : ctx.seqs) {
      pool.parallel_for(s.count, 16, [&](int64_t b, int64_t e, int) {
        std::vector<double> cs(static_cast<size_t>(dr));
        for (int64_t t = b; t < e; ++t) {
          rope.angles(s.base + t, cs.data());
          const int64_t r = s.begin + t;
          for (int64_t h = 0; h < nH; ++h)
            Rope::apply(cs.data(), dr, q.data() + r * qw + h * (dn + dr) + dn);
          Rope::apply(cs.data(), dr, ckv.data() + r * cw + dc);
        }
      });
    }
  }
  std::vector<float> gate;
  if (m.output_gate) {
    gate.resize(static_cast<size_t>(R * nH * dv));
    kernels::matmul(w.g, u, R, H, gate.data(), nH * dv, pool);
  }

  // Append the new latent rows to each sequence's cache.
  for (const SeqRows& s : ctx.seqs) {
    MlaLayerCache& cache = s.state->mla()[static_cast<size_t>(s.state->mla_slot(layer))];
    if (cache.length() != s.base) {
      fail("internal: MLA cache of layer {} holds {} positions, the sequence is at {}", layer,
           cache.length(), s.base);
    }
    cache.rows.insert(cache.rows.end(), ckv.begin() + s.begin * cw,
                      ckv.begin() + (s.begin + s.count) * cw);
  }

  // Attention, one task per (sequence, head).
  std::vector<float> o(static_cast<size_t>(R * nH * dv));
  const float scale = mla_softmax_scale(m);
  const kernels::MatmulFn mm = kernels::matmul_fn(w.kv_b.format);
  const kernels::MatmulTFn mt = kernels::matmul_t_fn(w.kv_b.format);
  const int64_t n_tasks = static_cast<int64_t>(ctx.seqs.size()) * nH;
  pool.run(static_cast<int>(n_tasks), [&](int task, int) {
    const SeqRows& s = ctx.seqs[static_cast<size_t>(task / nH)];
    const int64_t h = task % nH;
    const MlaLayerCache& cache = s.state->mla()[static_cast<size_t>(s.state->mla_slot(layer))];
    const Matrix wk = w.kv_b.row_slice(h * kvb_stride, h * kvb_stride + dn);
    const Matrix wv = w.kv_b.row_slice(h * kvb_stride + dn, (h + 1) * kvb_stride);
    // q̃ rows: [Wk_hᵀ q_nope | q_pe] per new row.
    std::vector<float> qt(static_cast<size_t>(s.count * cw), 0.0f);
    mt(wk, 0, dc, q.data() + s.begin * qw + h * (dn + dr), s.count, qw, qt.data(), cw);
    for (int64_t t = 0; t < s.count; ++t) {
      std::memcpy(qt.data() + t * cw + dc, q.data() + (s.begin + t) * qw + h * (dn + dr) + dn,
                  static_cast<size_t>(dr) * sizeof(float));
    }
    std::vector<float> obar(static_cast<size_t>(s.count * dc));
    latent_attention_rows(qt.data(), s.count, s.base, cache.rows.data(), cw, dc, scale,
                          obar.data());
    mm(wv, 0, dv, obar.data(), s.count, dc, o.data() + s.begin * nH * dv + h * dv, nH * dv, false);
  });

  if (m.output_gate) {
    for (size_t i = 0; i < o.size(); ++i) o[i] *= ops::sigmoid(gate[i]);
  }
  kernels::matmul(w.o, o.data(), R, nH * dv, y, H, pool);
}

void latent_attention_rows(const float* q, int64_t count, int64_t base, const float* cache,
                           int64_t cw, int64_t dc, float scale, float* obar) {
  // Query rows go through in blocks: the block's scores are one product with the cache rows
  // the block sees (each cache row read once per block, not once per query row), and its
  // weighted sums one transposed product. Later positions of the block's own rows get weight
  // 0 in that product, which adds exact zeros.
  constexpr int64_t kBlock = 32;
  const kernels::MatmulFn mm = kernels::matmul_fn(WeightFormat::kF32);
  const kernels::MatmulTFn mt = kernels::matmul_t_fn(WeightFormat::kF32);
  std::vector<float> scores(static_cast<size_t>(std::min(kBlock, count) * (base + count)));
  std::fill(obar, obar + count * dc, 0.0f);
  for (int64_t t0 = 0; t0 < count; t0 += kBlock) {
    const int64_t tb = std::min(kBlock, count - t0), nb = base + t0 + tb;
    Matrix rows;
    rows.format = WeightFormat::kF32;
    rows.rows = nb;
    rows.cols = cw;
    rows.data = cache;
    mm(rows, 0, nb, q + t0 * cw, tb, cw, scores.data(), nb, false);
    for (int64_t t = 0; t < tb; ++t) {
      float* sc = scores.data() + t * nb;
      const int64_t n = base + t0 + t + 1;  // causal: positions 0 .. base + t0 + t
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        sc[j] *= scale;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        sc[j] = std::exp(sc[j] - mx);
        sum += sc[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < n; ++j) sc[j] *= inv;
      std::fill(sc + n, sc + nb, 0.0f);
    }
    mt(rows, 0, dc, scores.data(), tb, nb, obar + t0 * dc, dc);
  }
}

void latent_attention(const float* q, const float* cache, int64_t n, int64_t cw, int64_t dc,
                      float scale, float* obar) {
  latent_attention_rows(q, 1, n - 1, cache, cw, dc, scale, obar);
}

}  // namespace deltafin
