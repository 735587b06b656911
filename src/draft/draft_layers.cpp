// Draft-model layers (see draft_layers.h). fp32 activations, BF16 weights decoded in the kernels
// as for the target; norms use the draft's eps everywhere, the MLA latent norms included (the
// target's use 1e-6, the drafts' 1e-5: docs/DRAFT-MODELS.md §5). RoPE tables are computed in double
// and rounded once, so positions far into a long context lose nothing to accumulated error.
#include "draft/draft_layers.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "model/latent_attention.h"
#include "model/ops.h"
#include "model/weights.h"

namespace deltafin {

namespace {

double yarn_mscale(double factor, double m) {
  return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

}  // namespace

Yarn::Yarn(const YarnConfig& y, int64_t rope_dim) {
  const int64_t half = rope_dim / 2;
  const double d = static_cast<double>(rope_dim);
  const bool scaled = y.factor > 1.0 && y.original_max_positions > 0;
  double low = 0, high = 0;
  if (scaled) {
    auto corr = [&](double rotations) {
      return d * std::log(y.original_max_positions / (rotations * 2.0 * M_PI)) /
             (2.0 * std::log(y.theta));
    };
    low = std::max(std::floor(corr(y.beta_fast)), 0.0);
    high = std::min(std::ceil(corr(y.beta_slow)), d - 1.0);
    if (low == high) high += 0.001;
  }
  for (int64_t i = 0; i < half; ++i) {
    const double extra = 1.0 / std::pow(y.theta, static_cast<double>(2 * i) / d);
    if (!scaled) {
      inv_freq_.push_back(extra);
      continue;
    }
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double keep = 1.0 - ramp;  // the share of the original frequency
    inv_freq_.push_back(extra / y.factor * (1.0 - keep) + extra * keep);
  }
  if (scaled) {
    cos_scale_ = yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim);
    if (y.mscale_all_dim != 0.0) {
      const double m = yarn_mscale(y.factor, y.mscale_all_dim);
      score_scale_ = static_cast<float>(m * m);
    }
  }
}

void Yarn::rotate(float* x, int64_t position) const {
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const double a = static_cast<double>(position) * inv_freq_[i];
    const float c = static_cast<float>(std::cos(a) * cos_scale_);
    const float s = static_cast<float>(std::sin(a) * cos_scale_);
    const float x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * c - x1 * s;
    x[2 * i + 1] = x0 * s + x1 * c;
  }
}

DraftTensors::DraftTensors(std::shared_ptr<const Checkpoint> ck, std::string kind_name)
    : ck_(std::move(ck)), kind_(std::move(kind_name)) {}

const TensorInfo& DraftTensors::get(const std::string& name, std::vector<int64_t> shape) {
  const TensorInfo* t = ck_->find(name);
  if (t == nullptr) {
    fail("{}: tensor {} is missing (an {} draft needs it, shape {})", ck_->dir(), name, kind_,
         shape_to_string(shape));
  }
  if (t->shape != shape) {
    fail("{}: tensor {} has shape {}, expected {} for this config", ck_->dir(), name,
         t->shape_string(), shape_to_string(shape));
  }
  bytes_ += t->nbytes;
  return *t;
}

Matrix DraftTensors::matrix(const std::string& name, int64_t rows, int64_t cols) {
  const TensorInfo& t = get(name, {rows, cols});
  return weight_matrix(t, t.data);
}

std::vector<float> DraftTensors::vector(const std::string& name, int64_t n) {
  const TensorInfo& t = get(name, {n});
  return weight_vector(t, t.data);
}

DraftMla bind_draft_mla(DraftTensors& t, const DraftModelConfig& c, const std::string& p,
                        int64_t in) {
  const MlaConfig& m = c.mla;
  DraftMla w;
  w.q_a = t.matrix(p + "q_a_proj.weight", m.q_lora_rank, in);
  w.q_a_norm = t.vector(p + "q_a_layernorm.weight", m.q_lora_rank);
  w.q_b = t.matrix(p + "q_b_proj.weight", m.num_heads * m.q_head_dim(), m.q_lora_rank);
  w.kv_a = t.matrix(p + "kv_a_proj_with_mqa.weight", m.cache_width(), in);
  w.kv_a_norm = t.vector(p + "kv_a_layernorm.weight", m.kv_lora_rank);
  w.kv_b = t.matrix(p + "kv_b_proj.weight", m.num_heads * (m.qk_nope_dim + m.v_head_dim),
                    m.kv_lora_rank);
  w.o = t.matrix(p + "o_proj.weight", c.hidden, m.num_heads * m.v_head_dim);
  return w;
}

TapFusion bind_tap_fusion(DraftTensors& t, const DraftModelConfig& c, const std::string& proj) {
  const int64_t H = c.hidden, n = static_cast<int64_t>(c.taps.layers.size());
  TapFusion f;
  f.proj = t.matrix(proj, H, n * H);
  if (c.fc_norm) {
    for (int64_t i = 0; i < n; ++i)
      f.norms.push_back(t.vector(fmt::format("fc_norm.{}.weight", i), H));
  }
  return f;
}

void fuse_taps(const DraftModelConfig& c, const TapFusion& f, const float* taps, int64_t R,
               float* out, ThreadPool& pool) {
  const int64_t H = c.hidden, W = f.proj.cols;
  std::vector<float> x(taps, taps + R * W);
  for (int64_t r = 0; r < R; ++r) {
    for (size_t i = 0; i < f.norms.size(); ++i) {
      float* v = x.data() + r * W + static_cast<int64_t>(i) * H;
      draft_norm(v, f.norms[i], c.rms_eps, 1, H, v);
    }
  }
  kernels::matmul(f.proj, x.data(), R, W, out, H, pool);
}

DraftMlp bind_draft_mlp(DraftTensors& t, const DraftModelConfig& c, const std::string& p) {
  DraftMlp w;
  w.gate = t.matrix(p + "gate_proj.weight", c.intermediate, c.hidden);
  w.up = t.matrix(p + "up_proj.weight", c.intermediate, c.hidden);
  w.down = t.matrix(p + "down_proj.weight", c.hidden, c.intermediate);
  return w;
}

void draft_norm(const float* x, const std::vector<float>& w, float eps, int64_t R, int64_t n,
                float* out) {
  for (int64_t r = 0; r < R; ++r) ops::rmsnorm(x + r * n, w.data(), eps, n, out + r * n);
}

void draft_kv_rows(const DraftModelConfig& c, const DraftMla& w, const Yarn& yarn, const float* u,
                   int64_t R, const int64_t* positions, float* out, ThreadPool& pool) {
  const int64_t dc = c.mla.kv_lora_rank, cw = c.mla.cache_width();
  kernels::matmul(w.kv_a, u, R, w.kv_a.cols, out, cw, pool);
  for (int64_t r = 0; r < R; ++r) {
    ops::rmsnorm(out + r * cw, w.kv_a_norm.data(), c.rms_eps, dc, out + r * cw);
    yarn.rotate(out + r * cw + dc, positions[r]);
  }
}

void draft_attention(const DraftModelConfig& c, const DraftMla& w, const Yarn& yarn, const float* u,
                     int64_t R, const int64_t* positions, const float* cache,
                     const int64_t* visible, float* y, ThreadPool& pool) {
  const MlaConfig& m = c.mla;
  const int64_t nH = m.num_heads, dq = m.q_lora_rank, dc = m.kv_lora_rank;
  const int64_t dn = m.qk_nope_dim, dr = m.qk_rope_dim, dv = m.v_head_dim;
  const int64_t qw = nH * (dn + dr), cw = dc + dr, kvb_stride = dn + dv;
  std::vector<float> cq(static_cast<size_t>(R * dq));
  kernels::matmul(w.q_a, u, R, w.q_a.cols, cq.data(), dq, pool);
  draft_norm(cq.data(), w.q_a_norm, c.rms_eps, R, dq, cq.data());
  std::vector<float> q(static_cast<size_t>(R * qw));
  kernels::matmul(w.q_b, cq.data(), R, dq, q.data(), qw, pool);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t h = 0; h < nH; ++h)
      yarn.rotate(q.data() + r * qw + h * (dn + dr) + dn, positions[r]);
  }
  std::vector<float> o(static_cast<size_t>(R * nH * dv));
  const float scale = yarn.score_scale(dn + dr);
  const kernels::MatmulFn mm = kernels::matmul_fn(w.kv_b.format);
  const kernels::MatmulTFn mt = kernels::matmul_t_fn(w.kv_b.format);
  pool.run(static_cast<int>(R * nH), [&](int task, int) {
    const int64_t r = task / nH, h = task % nH;
    const Matrix wk = w.kv_b.row_slice(h * kvb_stride, h * kvb_stride + dn);
    const Matrix wv = w.kv_b.row_slice(h * kvb_stride + dn, (h + 1) * kvb_stride);
    std::vector<float> qt(static_cast<size_t>(cw), 0.0f);
    const float* qh = q.data() + r * qw + h * (dn + dr);
    mt(wk, 0, dc, qh, 1, qw, qt.data(), cw);
    std::memcpy(qt.data() + dc, qh + dn, static_cast<size_t>(dr) * sizeof(float));
    const int64_t n = visible[r];
    std::vector<float> obar(static_cast<size_t>(dc));
    latent_attention(qt.data(), cache, n, cw, dc, scale, obar.data());
    mm(wv, 0, dv, obar.data(), 1, dc, o.data() + r * nH * dv + h * dv, nH * dv, false);
  });
  kernels::matmul(w.o, o.data(), R, nH * dv, y, c.hidden, pool);
}

void draft_mlp_add(const DraftModelConfig& c, const DraftMlp& w, const float* x, int64_t R,
                   float* y, ThreadPool& pool) {
  const int64_t I = c.intermediate;
  std::vector<float> g(static_cast<size_t>(R * I)), up(g.size());
  kernels::matmul(w.gate, x, R, c.hidden, g.data(), I, pool);
  kernels::matmul(w.up, x, R, c.hidden, up.data(), I, pool);
  for (size_t i = 0; i < g.size(); ++i) g[i] = ops::silu(g[i]) * up[i];
  kernels::matmul(w.down, g.data(), R, I, y, c.hidden, pool, /*accumulate=*/true);
}

}  // namespace deltafin
