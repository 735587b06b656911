// EAGLE-3 / 3.1 drafting (see eagle3.h for the model). Rows are batched where the math allows:
// committing a run of accepted positions is one fc product and one kv_a product over all of
// them; the chain is sequential by nature (each step embeds the previous draft).
#include "draft/eagle3.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/kernels.h"

namespace deltafin {

Eagle3Model::Eagle3Model(DraftModelConfig c, std::shared_ptr<const Checkpoint> ck)
    : TapDraftModel(std::move(c), std::move(ck)) {
  DraftTensors t(ck_, "EAGLE-3");
  const int64_t H = c_.hidden;
  w_.fc = bind_tap_fusion(t, c_, "fc.weight");
  if (!c_.fc_norm && t.has("fc_norm.0.weight")) {
    fail(
        "{}: holds fc_norm.* tensors but its config.json says fc_norm false (an EAGLE-3.1 "
        "checkpoint needs \"fc_norm\": true and \"norm_output\": true)",
        ck_->dir());
  }
  const std::string l = "layers.0.";
  w_.hidden_norm = t.vector(l + "hidden_norm.weight", H);
  w_.input_norm = t.vector(l + "input_layernorm.weight", H);
  w_.post_norm = t.vector(l + "post_attention_layernorm.weight", H);
  w_.attn = bind_draft_mla(t, c_, l + "self_attn.", 2 * H);
  w_.mlp = bind_draft_mlp(t, c_, l + "mlp.");
  w_.norm = t.vector("norm.weight", H);
  w_.lm_head = t.matrix("lm_head.weight", c_.vocab, H);
  weight_bytes_ = t.bound_bytes();
}

std::unique_ptr<TapDrafter> Eagle3Model::new_drafter(Model& target) const {
  return drafter_for<Eagle3Drafter, Eagle3Model>(target);
}

Eagle3Drafter::Eagle3Drafter(Model& target, std::shared_ptr<const Eagle3Model> m)
    : LaggedTapDrafter(target, m->config().taps, m->config().norm_output ? "EAGLE-3.1" : "EAGLE-3",
                       m->state_id(), m->config().mla.cache_width(), m->config().hidden),
      m_(std::move(m)),
      c_(m_->config()),
      w_(m_->weights()) {}

void Eagle3Drafter::fuse(const float* taps, float* g) const {
  fuse_taps(c_, w_.fc, taps, 1, g, target_.pool());
}

void Eagle3Drafter::layer_input(std::span<const int32_t> tokens, const float* h, float* u) {
  const int64_t H = c_.hidden, R = static_cast<int64_t>(tokens.size());
  std::vector<float> e(static_cast<size_t>(R * H));
  target_.embed(tokens, e.data());
  for (int64_t r = 0; r < R; ++r) {
    draft_norm(e.data() + r * H, w_.input_norm, c_.rms_eps, 1, H, u + r * 2 * H);
    draft_norm(h + r * H, w_.hidden_norm, c_.rms_eps, 1, H, u + r * 2 * H + H);
  }
}

void Eagle3Drafter::commit_rows(std::span<const int32_t> history) {
  const int64_t H = c_.hidden, cw = c_.mla.cache_width();
  const int64_t L = static_cast<int64_t>(history.size()) - 1;  // committed positions
  TapRecorder& rec = taps();
  const int64_t fused_end = first_unheld(L);
  if (L > fused_end) {
    tail_.resize(tail_.size() + static_cast<size_t>((L - fused_end) * H));
    fuse_taps(c_, w_.fc, rec.row(fused_end), L - fused_end,
              tail_.data() + (fused_end - cache_len_) * H, target_.pool());
  }
  rec.consume_until(L);
  const int64_t n = L - 1 - cache_len_;  // rows (g_p, x_{p+1}) for p = cache_len_ .. L-2
  if (n <= 0) return;
  std::vector<float> u(static_cast<size_t>(n * 2 * H));
  layer_input(history.subspan(static_cast<size_t>(cache_len_ + 1), static_cast<size_t>(n)),
              tail_.data(), u.data());
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = cache_len_ + i;
  cache_.resize(static_cast<size_t>((cache_len_ + n) * cw));
  draft_kv_rows(c_, w_.attn, m_->yarn(), u.data(), n, pos.data(), cache_.data() + cache_len_ * cw,
                target_.pool());
  cache_len_ += n;
  tail_.erase(tail_.begin(), tail_.begin() + n * H);
}

DraftProposal Eagle3Drafter::draft(std::span<const int32_t> history, int max_tokens) {
  commit_rows(history);
  const int64_t H = c_.hidden, cw = c_.mla.cache_width(), V = c_.vocab;
  ThreadPool& pool = target_.pool();
  DraftProposal out;
  std::vector<float> h(tail_.begin(), tail_.begin() + H);  // g_{L-1}
  std::vector<float> u(static_cast<size_t>(2 * H)), a(static_cast<size_t>(H)), xn(a.size()),
      y(a.size());
  int32_t x = history.back();
  int64_t pos = cache_len_;  // L-1
  const int64_t steps = std::min<int64_t>(max_tokens, c_.max_positions - pos);
  for (int64_t j = 0; j < steps; ++j, ++pos) {
    layer_input(std::span<const int32_t>(&x, 1), h.data(), u.data());
    cache_.resize(cache_.size() + static_cast<size_t>(cw));
    draft_kv_rows(c_, w_.attn, m_->yarn(), u.data(), 1, &pos, cache_.data() + cache_.size() - cw,
                  pool);
    const int64_t visible = static_cast<int64_t>(cache_.size()) / cw;
    draft_attention(c_, w_.attn, m_->yarn(), u.data(), 1, &pos, cache_.data(), &visible, a.data(),
                    pool);
    for (int64_t i = 0; i < H; ++i) a[i] += h[i];  // r = h + attention
    draft_norm(a.data(), w_.post_norm, c_.rms_eps, 1, H, xn.data());
    draft_mlp_add(c_, w_.mlp, xn.data(), 1, a.data(), pool);
    draft_norm(a.data(), w_.norm, c_.rms_eps, 1, H, y.data());
    last_logits_.resize(last_logits_.size() + static_cast<size_t>(V));
    float* logits = last_logits_.data() + last_logits_.size() - V;
    kernels::matmul(w_.lm_head, y.data(), 1, H, logits, V, pool);
    const std::span<const float> row(logits, static_cast<size_t>(V));
    x = argmax_row(row);
    out.tokens.push_back(x);
    h = c_.norm_output ? y : a;
  }
  cache_.resize(static_cast<size_t>(cache_len_ * cw));  // chain rows are dropped
  return out;
}

}  // namespace deltafin
