// DSpark drafting (see dspark.h). The block is one batched pass of B rows per layer; the
// Markov rows and the confidence head are per-row vector products (rank is small).
#include "draft/dspark.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/kernels.h"
#include "model/ops.h"

namespace deltafin {

DSparkModel::DSparkModel(DraftModelConfig c, std::shared_ptr<const Checkpoint> ck)
    : TapDraftModel(std::move(c), std::move(ck)) {
  DraftTensors t(ck_, "DSpark");
  const int64_t H = c_.hidden;
  w_.context = bind_tap_fusion(t, c_, "context_proj.weight");
  w_.context_norm = t.vector("context_norm.weight", H);
  for (int64_t l = 0; l < c_.num_layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    DSparkLayer layer;
    layer.input_norm = t.vector(p + "input_layernorm.weight", H);
    layer.post_norm = t.vector(p + "post_attention_layernorm.weight", H);
    layer.attn = bind_draft_mla(t, c_, p + "self_attn.", H);
    layer.mlp = bind_draft_mlp(t, c_, p + "mlp.");
    w_.layers.push_back(std::move(layer));
  }
  w_.final_norm = t.vector("final_norm.weight", H);
  w_.markov_w1 = t.matrix("markov_head.markov_w1.weight", c_.vocab, c_.markov_rank);
  w_.markov_w2 = t.matrix("markov_head.markov_w2.weight", c_.vocab, c_.markov_rank);
  if (c_.confidence_head) {
    const int64_t in = H + (c_.confidence_with_markov ? c_.markov_rank : 0);
    const Matrix cw = t.matrix("confidence_head.proj.weight", 1, in);
    w_.confidence_w.resize(static_cast<size_t>(in));
    for (int64_t i = 0; i < in; ++i) w_.confidence_w[i] = matrix_element(cw, 0, i);
    w_.confidence_b = t.vector("confidence_head.proj.bias", 1);
  }
  weight_bytes_ = t.bound_bytes();
}

std::unique_ptr<TapDrafter> DSparkModel::new_drafter(Model& target) const {
  return drafter_for<DSparkDrafter, DSparkModel>(target);
}

DSparkDrafter::DSparkDrafter(Model& target, std::shared_ptr<const DSparkModel> m)
    : TapDrafter(target, m->config().taps, "DSpark", m->state_id()),
      m_(std::move(m)),
      c_(m_->config()),
      w_(m_->weights()),
      caches_(static_cast<size_t>(c_.num_layers)) {}

void DSparkDrafter::reset() {
  for (auto& c : caches_) c.clear();
  context_len_ = 0;
}

void DSparkDrafter::sync(std::span<const int32_t> committed) {
  inject_context(static_cast<int64_t>(committed.size()));
}

// A row per committed position: every layer's context row, layer after layer.
DraftRows DSparkDrafter::export_rows(int64_t from) const {
  const int64_t cw = c_.mla.cache_width(), layers = static_cast<int64_t>(caches_.size());
  DraftRows r;
  r.width = cw * layers;
  r.begin = std::clamp<int64_t>(from, 0, context_len_);
  r.rows.resize(static_cast<size_t>((context_len_ - r.begin) * r.width));
  for (int64_t p = r.begin; p < context_len_; ++p) {
    for (int64_t l = 0; l < layers; ++l) {
      const float* src = caches_[static_cast<size_t>(l)].data() + p * cw;
      std::copy(src, src + cw, r.rows.begin() + (p - r.begin) * r.width + l * cw);
    }
  }
  return r;
}

void DSparkDrafter::import_rows(const DraftRows& r, int64_t position) {
  const int64_t cw = c_.mla.cache_width(), layers = static_cast<int64_t>(caches_.size());
  if (r.width != cw * layers || r.lag != 0 || r.begin != 0 || r.count() != position ||
      !r.tail.empty()) {
    fail(
        "the kept draft state does not fit this DSpark drafter ({} rows of {} floats for {} "
        "positions)",
        r.count(), r.width, position);
  }
  for (int64_t l = 0; l < layers; ++l) {
    auto& cache = caches_[static_cast<size_t>(l)];
    cache.resize(static_cast<size_t>(position * cw));
    for (int64_t p = 0; p < position; ++p) {
      const float* src = r.rows.data() + p * r.width + l * cw;
      std::copy(src, src + cw, cache.begin() + p * cw);
    }
  }
  context_len_ = position;
}

void DSparkDrafter::inject_context(int64_t L) {
  TapRecorder& rec = taps();
  if (rec.end() != L || rec.begin() > context_len_) {
    fail(
        "the target's taps cover positions {}..{}, the draft needs {}..{} (a prefix that ran "
        "without this drafter?)",
        rec.begin(), rec.end() - 1, context_len_, L - 1);
  }
  const int64_t n = L - context_len_;
  if (n <= 0) return;
  const int64_t H = c_.hidden, cw = c_.mla.cache_width();
  ThreadPool& pool = target_.pool();
  std::vector<float> ctx(static_cast<size_t>(n * H));
  fuse_taps(c_, w_.context, rec.row(context_len_), n, ctx.data(), pool);
  rec.consume_until(L);
  draft_norm(ctx.data(), w_.context_norm, c_.rms_eps, n, H, ctx.data());
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = context_len_ + i;
  for (size_t l = 0; l < caches_.size(); ++l) {
    caches_[l].resize(static_cast<size_t>(L * cw));
    draft_kv_rows(c_, w_.layers[l].attn, m_->yarn(), ctx.data(), n, pos.data(),
                  caches_[l].data() + context_len_ * cw, pool);
  }
  context_len_ = L;
}

DraftProposal DSparkDrafter::draft(std::span<const int32_t> history, int max_tokens) {
  const int64_t L = static_cast<int64_t>(history.size()) - 1;
  inject_context(L);
  const int64_t B = c_.block_size, H = c_.hidden, V = c_.vocab, cw = c_.mla.cache_width();
  const int64_t rank = c_.markov_rank;
  ThreadPool& pool = target_.pool();
  std::vector<int32_t> block(static_cast<size_t>(B), static_cast<int32_t>(c_.mask_token_id));
  block[0] = history.back();
  std::vector<int64_t> pos(static_cast<size_t>(B)), visible(static_cast<size_t>(B), L + B);
  for (int64_t r = 0; r < B; ++r) pos[static_cast<size_t>(r)] = L + r;
  std::vector<float> h(static_cast<size_t>(B * H)), xn(h.size()), a(h.size());
  target_.embed(block, h.data());
  for (size_t l = 0; l < caches_.size(); ++l) {
    const DSparkLayer& w = w_.layers[l];
    std::vector<float>& cache = caches_[l];
    draft_norm(h.data(), w.input_norm, c_.rms_eps, B, H, xn.data());
    cache.resize(static_cast<size_t>((L + B) * cw));  // the block's rows, dropped below
    draft_kv_rows(c_, w.attn, m_->yarn(), xn.data(), B, pos.data(), cache.data() + L * cw, pool);
    draft_attention(c_, w.attn, m_->yarn(), xn.data(), B, pos.data(), cache.data(), visible.data(),
                    a.data(), pool);
    cache.resize(static_cast<size_t>(L * cw));
    for (size_t i = 0; i < h.size(); ++i) h[i] += a[i];
    draft_norm(h.data(), w.post_norm, c_.rms_eps, B, H, xn.data());
    draft_mlp_add(c_, w.mlp, xn.data(), B, h.data(), pool);
  }
  const int64_t k = std::min<int64_t>(max_tokens, B);
  draft_norm(h.data(), w_.final_norm, c_.rms_eps, k, H, xn.data());
  last_logits_.assign(static_cast<size_t>(k * V), 0.0f);
  target_.lm_head(xn.data(), k, last_logits_.data());

  DraftProposal out;
  std::vector<float> w1(static_cast<size_t>(rank)), corrected(static_cast<size_t>(V));
  int32_t prev = history.back();
  for (int64_t r = 0; r < k; ++r) {
    for (int64_t i = 0; i < rank; ++i) w1[i] = matrix_element(w_.markov_w1, prev, i);
    kernels::matmul(w_.markov_w2, w1.data(), 1, rank, corrected.data(), V, pool);
    const float* logits = last_logits_.data() + r * V;
    for (int64_t v = 0; v < V; ++v) corrected[v] += logits[v];
    if (!w_.confidence_w.empty()) {
      double z = w_.confidence_b[0];
      for (int64_t i = 0; i < H; ++i) z += double(w_.confidence_w[i]) * xn[r * H + i];
      for (int64_t i = 0; H + i < static_cast<int64_t>(w_.confidence_w.size()); ++i)
        z += double(w_.confidence_w[H + i]) * w1[i];
      out.confidence.push_back(ops::sigmoid(static_cast<float>(z)));
    }
    prev = argmax_row(corrected);
    out.tokens.push_back(prev);
  }
  return out;
}

}  // namespace deltafin
