#include "reference_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "model/inventory.h"
#include "storage/checkpoint.h"
#include "tensor/matrix.h"

namespace deltafin::test {

namespace {
double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<double>& w,
                            double eps) {
  double s = 0;
  for (double v : x) s += v * v;
  double inv = 1.0 / std::sqrt(s / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * x[i] * inv;
  return y;
}

std::vector<double> mix(const std::vector<std::vector<double>>& cands,
                        const std::vector<double>& norm, const std::vector<double>& proj,
                        double eps) {
  std::vector<double> s(cands.size());
  for (size_t j = 0; j < cands.size(); ++j) {
    auto r = rmsnorm(cands[j], norm, eps);
    s[j] = 0;
    for (size_t d = 0; d < r.size(); ++d) s[j] += r[d] * proj[d];
  }
  double mx = *std::max_element(s.begin(), s.end()), sum = 0;
  for (auto& v : s) sum += (v = std::exp(v - mx));
  std::vector<double> out(cands[0].size(), 0.0);
  for (size_t j = 0; j < cands.size(); ++j)
    for (size_t d = 0; d < out.size(); ++d) out[d] += s[j] / sum * cands[j][d];
  return out;
}

double situ(double g, double u, double b, double lb) {
  return b * std::tanh(g / b) * sigmoid(g) * lb * std::tanh(u / lb);
}
}  // namespace

ReferenceModel::ReferenceModel(const std::string& dir, Options options) : opt_(options) {
  c_ = load_config(dir);
  ck_ = Checkpoint::open(dir);
}

const ReferenceModel::Mat& ReferenceModel::mat(const std::string& name) {
  auto it = mats_.find(name);
  if (it != mats_.end()) return it->second;
  Matrix m;
  if (const TensorInfo* packed = ck_->find(name + ".weight_packed")) {
    const TensorInfo& sc = ck_->get(name + ".weight_scale");
    m = {WeightFormat::kMXFP4, packed->shape[0], packed->shape[1] * 2, packed->data, sc.data};
  } else {
    const TensorInfo& t = ck_->get(name + ".weight");
    m = {t.dtype == DType::kF32 ? WeightFormat::kF32 : WeightFormat::kBF16, t.shape[0], t.shape[1],
         t.data, nullptr};
  }
  Mat out;
  out.rows = m.rows;
  out.cols = m.cols;
  out.w.resize(static_cast<size_t>(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t col = 0; col < m.cols; ++col) out.w[r * m.cols + col] = matrix_element(m, r, col);
  return mats_.emplace(name, std::move(out)).first->second;
}

const std::vector<double>& ReferenceModel::vec(const std::string& name) {
  auto it = vecs_.find(name);
  if (it != vecs_.end()) return it->second;
  const TensorInfo& t = ck_->get(name);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype == DType::kF32) {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      v[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      v[i] = bf16_to_f32(h);
    }
  }
  return vecs_.emplace(name, std::move(v)).first->second;
}

std::vector<double> ReferenceModel::mv(const std::string& name, const std::vector<double>& x) {
  const Mat& m = mat(name);
  std::vector<double> y(static_cast<size_t>(m.rows), 0.0);
  for (int64_t r = 0; r < m.rows; ++r) {
    double s = 0;
    for (int64_t col = 0; col < m.cols; ++col) s += m.w[r * m.cols + col] * x[col];
    y[r] = s;
  }
  return y;
}

std::vector<double> ReferenceModel::logits(const std::vector<int32_t>& tokens) {
  const ModelConfig& c = c_;
  const int64_t H = c.hidden, L = c.num_layers;
  const double eps = c.rms_eps;
  const int64_t nh = c.kda.num_heads, dk = c.kda.head_dim, Pk = nh * dk, Kc = c.kda.conv_kernel;
  const auto& ml = c.mla;
  // Per-layer sequence state.
  std::vector<std::vector<double>> S(L);                     // KDA [nh][dk][dk]
  std::vector<std::vector<std::vector<double>>> conv_in(L);  // KDA pre-conv rows (all so far)
  std::vector<std::vector<std::vector<double>>> cache_c(L), cache_pe(L);
  std::vector<double> out_logits;
  const Mat& embed = mat("language_model.model.embed_tokens");
  for (int32_t tok : tokens) {
    std::vector<double> p(embed.w.begin() + tok * H, embed.w.begin() + (tok + 1) * H);
    std::vector<std::vector<double>> anchors;
    bool p_empty = false;
    for (int64_t i = 0; i < L; ++i) {
      const std::string P = layer_prefix(c, i);
      std::vector<double> a;
      if (anchors.empty()) {
        a = p;
      } else {
        auto cands = anchors;
        cands.push_back(p);
        a = mix(cands, vec(P + "self_attention_res_norm.weight"),
                vec(P + "self_attention_res_proj.weight"), eps);
      }
      if (i % c.attn_res_block == 0) {
        anchors.push_back(p);
        p_empty = true;
      }
      auto u = rmsnorm(a, vec(P + "input_layernorm.weight"), eps);
      const std::string A = P + "self_attn.";
      std::vector<double> y(H, 0.0);
      if (c.is_mla(i)) {
        auto cq = rmsnorm(mv(A + "q_a_proj", u), vec(A + "q_a_layernorm.weight"), 1e-6);
        auto q = mv(A + "q_b_proj", cq);
        auto ckv = mv(A + "kv_a_proj_with_mqa", u);
        std::vector<double> lat(ckv.begin(), ckv.begin() + ml.kv_lora_rank);
        cache_c[i].push_back(rmsnorm(lat, vec(A + "kv_a_layernorm.weight"), 1e-6));
        cache_pe[i].emplace_back(ckv.begin() + ml.kv_lora_rank, ckv.end());
        const Mat& kvb = mat(A + "kv_b_proj");
        const int64_t n = static_cast<int64_t>(cache_c[i].size()), dn = ml.qk_nope_dim,
                      dr = ml.qk_rope_dim, dv = ml.v_head_dim;
        std::vector<double> o(ml.num_heads * dv, 0.0);
        for (int64_t h = 0; h < ml.num_heads; ++h) {
          std::vector<double> sc(n);
          std::vector<std::vector<double>> vals(n);
          for (int64_t j = 0; j < n; ++j) {
            auto kv = std::vector<double>(dn + dv, 0.0);
            for (int64_t d = 0; d < dn + dv; ++d)
              for (int64_t l = 0; l < ml.kv_lora_rank; ++l)
                kv[d] += kvb.w[(h * (dn + dv) + d) * kvb.cols + l] * cache_c[i][j][l];
            double s = 0;
            for (int64_t d = 0; d < dn; ++d) s += q[h * (dn + dr) + d] * kv[d];
            for (int64_t d = 0; d < dr; ++d) s += q[h * (dn + dr) + dn + d] * cache_pe[i][j][d];
            sc[j] = s / std::sqrt(static_cast<double>(dn + dr));
            vals[j].assign(kv.begin() + dn, kv.end());
          }
          double mx = *std::max_element(sc.begin(), sc.end()), sum = 0;
          for (auto& s : sc) sum += (s = std::exp(s - mx));
          for (int64_t j = 0; j < n; ++j)
            for (int64_t d = 0; d < dv; ++d) o[h * dv + d] += sc[j] / sum * vals[j][d];
        }
        if (ml.output_gate) {
          auto g = mv(A + "g_proj", u);
          for (size_t d = 0; d < o.size(); ++d) o[d] *= sigmoid(g[d]);
        }
        y = mv(A + "o_proj", o);
      } else {
        auto qh = mv(A + "q_proj", u), kh = mv(A + "k_proj", u), vh = mv(A + "v_proj", u);
        std::vector<double> row(3 * Pk);
        std::copy(qh.begin(), qh.end(), row.begin());
        std::copy(kh.begin(), kh.end(), row.begin() + Pk);
        std::copy(vh.begin(), vh.end(), row.begin() + 2 * Pk);
        conv_in[i].push_back(row);
        const int64_t t = static_cast<int64_t>(conv_in[i].size()) - 1;
        std::vector<double> act(3 * Pk);
        const char* names[3] = {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"};
        for (int part = 0; part < 3; ++part) {
          const auto& w = vec(A + names[part]);
          for (int64_t ch = 0; ch < Pk; ++ch) {
            double s = 0;
            for (int64_t j = 0; j < Kc; ++j) {
              int64_t tt = t - (Kc - 1) + j;
              if (tt >= 0) s += w[ch * Kc + j] * conv_in[i][tt][part * Pk + ch];
            }
            act[part * Pk + ch] = s * sigmoid(s);
          }
        }
        auto z = mv(A + "f_b_proj", mv(A + "f_a_proj", u));
        const auto& dt = vec(A + "dt_bias");
        const auto& alog = vec(A + "A_log");
        auto bl = mv(A + "b_proj", u);
        auto g = mv(A + "g_proj", u);
        if (S[i].empty()) S[i].assign(nh * dk * dk, 0.0);
        std::vector<double> o(Pk);
        for (int64_t h = 0; h < nh; ++h) {
          double* q = &act[h * dk];
          double* k = &act[Pk + h * dk];
          double* v = &act[2 * Pk + h * dk];
          double sq = 0, sk = 0;
          for (int64_t d = 0; d < dk; ++d) sq += q[d] * q[d], sk += k[d] * k[d];
          for (int64_t d = 0; d < dk; ++d) {
            q[d] = q[d] / std::sqrt(sq + 1e-6) / std::sqrt(static_cast<double>(dk));
            k[d] = k[d] / std::sqrt(sk + 1e-6);
          }
          double* Sh = &S[i][h * dk * dk];
          // exp(A_log) per head; per key channel (padding reads as 0) under the negative control.
          auto a_log_of = [&](const std::vector<double>& al, int64_t hh, int64_t d) {
            if (!opt_.a_log_per_channel) return al[static_cast<size_t>(hh)];
            return d < static_cast<int64_t>(al.size()) ? al[static_cast<size_t>(d)] : 0.0;
          };
          const double beta = sigmoid(bl[h]);
          for (int64_t d = 0; d < dk; ++d) {
            double gdec = c.kda.gate_lower_bound * sigmoid(std::exp(a_log_of(alog, h, d)) *
                                                           (z[h * dk + d] + dt[h * dk + d]));
            double al = std::exp(gdec);
            for (int64_t j = 0; j < dk; ++j) Sh[d * dk + j] *= al;
          }
          std::vector<double> e(dk);
          for (int64_t j = 0; j < dk; ++j) {
            double s = 0;
            for (int64_t d = 0; d < dk; ++d) s += Sh[d * dk + j] * k[d];
            e[j] = v[j] - s;
          }
          for (int64_t d = 0; d < dk; ++d)
            for (int64_t j = 0; j < dk; ++j) Sh[d * dk + j] += beta * k[d] * e[j];
          std::vector<double> oh(dk, 0.0);
          for (int64_t j = 0; j < dk; ++j)
            for (int64_t d = 0; d < dk; ++d) oh[j] += Sh[d * dk + j] * q[d];
          oh = rmsnorm(oh, vec(A + "o_norm.weight"), eps);
          for (int64_t j = 0; j < dk; ++j) o[h * dk + j] = oh[j] * sigmoid(g[h * dk + j]);
        }
        y = mv(A + "o_proj", o);
      }
      if (p_empty) {
        p = y;
        p_empty = false;
      } else {
        for (int64_t d = 0; d < H; ++d) p[d] += y[d];
      }
      auto cands = anchors;
      cands.push_back(p);
      auto m = mix(cands, vec(P + "mlp_res_norm.weight"), vec(P + "mlp_res_proj.weight"), eps);
      auto x = rmsnorm(m, vec(P + "post_attention_layernorm.weight"), eps);
      std::vector<double> zout;
      auto mlp = [&](const std::string& pre, const std::vector<double>& in) {
        auto gg = mv(pre + "gate_proj", in), uu = mv(pre + "up_proj", in);
        for (size_t d = 0; d < gg.size(); ++d)
          gg[d] = situ(gg[d], uu[d], c.situ_beta, c.situ_linear_beta);
        return mv(pre + "down_proj", gg);
      };
      if (c.is_dense(i)) {
        zout = mlp(P + "mlp.", x);
      } else {
        const std::string M = P + "block_sparse_moe.";
        auto lg = mv(M + "gate", x);
        const auto& bias = vec(M + "gate.e_score_correction_bias");
        const int64_t E = c.moe.num_experts;
        std::vector<double> s(E), choice(E);
        for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(lg[e]), choice[e] = s[e] + bias[e];
        std::vector<int> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return choice[a] > choice[b]; });
        order.resize(c.moe.top_k);
        double sum = 0;
        for (int e : order) sum += s[e];
        auto xi = mv(M + "routed_expert_down_proj", x);
        std::vector<double> ybar(c.moe.latent_dim, 0.0);
        for (int e : order) {
          const std::string E_ = expert_prefix(c, i, e);
          auto gg = mv(E_ + "w1", xi), uu = mv(E_ + "w3", xi);
          for (size_t d = 0; d < gg.size(); ++d)
            gg[d] = situ(gg[d], uu[d], c.situ_beta, c.situ_linear_beta);
          auto ye = mv(E_ + "w2", gg);
          double w =
              (c.moe.renormalize ? s[e] / (sum + 1e-20) : s[e]) * c.moe.routed_scaling_factor;
          for (size_t d = 0; d < ybar.size(); ++d) ybar[d] += w * ye[d];
        }
        if (c.moe.latent_norm) ybar = rmsnorm(ybar, vec(M + "routed_expert_norm.weight"), eps);
        zout = mv(M + "routed_expert_up_proj", ybar);
        if (c.moe.num_shared_experts > 0) {
          auto sh = mlp(M + "shared_experts.", x);
          for (int64_t d = 0; d < H; ++d) zout[d] += sh[d];
        }
      }
      for (int64_t d = 0; d < H; ++d) p[d] += zout[d];
    }
    auto cands = anchors;
    cands.push_back(p);
    auto out = mix(cands, vec("language_model.model.output_attn_res_norm.weight"),
                   vec("language_model.model.output_attn_res_proj.weight"), eps);
    auto lg = mv(c.tie_embeddings ? "language_model.model.embed_tokens" : "language_model.lm_head",
                 rmsnorm(out, vec("language_model.model.norm.weight"), eps));
    out_logits.insert(out_logits.end(), lg.begin(), lg.end());
  }
  return out_logits;
}

}  // namespace deltafin::test
