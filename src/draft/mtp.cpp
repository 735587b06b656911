// The MTP drafter (see mtp.h). The layer runs through the model's own layer functions over a
// one-sequence LayerContext: committing a run of accepted positions is one pass of the layer's
// attention over all of them (their cache rows); the chain runs the whole layer one row at a
// time (each step embeds the previous draft).
#include "draft/mtp.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "kernels/kernels.h"
#include "model/layers.h"
#include "model/ops.h"
#include "storage/checkpoint.h"
#include "storage/expert_directory.h"
#include "storage/trunk_units.h"
#include "tensor/matrix.h"
#include "tensor/tensor_info.h"

namespace deltafin {

namespace {

// One embedding row decoded exactly (BF16 as released, or F32), as the trunk's embed does.
void mtp_embed_row(const Matrix& e, int32_t token, float* out) {
  const Matrix row = e.row_slice(token, token + 1);
  for (int64_t i = 0; i < e.cols; ++i) out[i] = matrix_element(row, 0, i);
}

}  // namespace

MtpModel::MtpModel(const std::string& model_dir, const ModelConfig& target)
    : DraftModel(DraftModelConfig{}) {
  if (target.mtp_layers <= 0) {
    fail_setting("draft", "mtp", "{} has no MTP layer (num_nextn_predict_layers is 0)", model_dir);
  }
  ck_ = Checkpoint::open(model_dir);
  const InventoryReport inv = check_inventory(target, *ck_);
  const int L = static_cast<int>(target.num_layers);
  // The layer as the model's code sees it: the last layer of a config whose only MoE layer it is
  // (no other layer of this config is ever run; their caches stay empty).
  layer_config_ = target;
  layer_config_.num_layers = L + 1;
  layer_config_.layer_kinds.push_back(LayerKind::kMLA);
  layer_config_.first_k_dense = L;
  layer_config_.mtp_layers = 0;
  const int64_t H = target.hidden, V = target.vocab;
  const TensorLookup lookup = checkpoint_lookup(*ck_);
  const std::string P = target.names.layer(L);
  w_.embed = lookup_matrix(lookup, P + "embed_tokens.weight");
  w_.enorm = lookup_vector(lookup, P + "enorm.weight");
  w_.hnorm = lookup_vector(lookup, P + "hnorm.weight");
  w_.eh_proj = lookup_matrix(lookup, P + "eh_proj.weight");
  w_.layer = bind_layer(layer_config_, L, lookup);
  w_.head_norm = lookup_vector(lookup, P + "shared_head.norm.weight");
  w_.head = lookup_matrix(lookup, P + "shared_head.head.weight");
  if (w_.embed.rows != V || w_.embed.cols != H || w_.eh_proj.rows != H ||
      w_.eh_proj.cols != 2 * H || w_.head.rows != V || w_.head.cols != H) {
    fail("{}: the MTP layer's embed_tokens, eh_proj or shared_head.head has the wrong shape",
         model_dir);  // the inventory check already refuses this; kept as the binding's guard
  }
  experts_ = std::make_unique<MmapExpertProvider>(layer_config_, *ck_, inv.expert_format);
  for (const auto& [name, t] : ck_->tensors()) {
    if (name.starts_with(P)) weight_bytes_ += t.nbytes;
  }
  c_.path = (std::filesystem::path(model_dir) / "config.json").string();
  c_.kind = DraftKind::kMtp;
  c_.hidden = H;
  c_.vocab = V;
  c_.num_layers = 1;
  c_.mla = target.mla;
  c_.rms_eps = target.rms_eps;
  c_.max_positions = target.max_positions;
  c_.taps.layers = {L - 1};
  c_.taps.stream = TapStream::kFinal;
  c_.target_layers = L;
}

std::unique_ptr<TapDrafter> MtpModel::new_drafter(Model& target) const {
  return drafter_for<MtpDrafter, MtpModel>(target);
}

std::shared_ptr<DraftModel> open_mtp_model(const std::string& model_dir,
                                           const ModelConfig& target) {
  return std::make_shared<MtpModel>(model_dir, target);
}

MtpDrafter::MtpDrafter(Model& target, std::shared_ptr<const MtpModel> m)
    : LaggedTapDrafter(target, m->config().taps, "MTP", m->state_id(),
                       m->layer_config().mla.cache_width(), m->layer_config().hidden),
      m_(std::move(m)),
      c_(m_->layer_config()),
      w_(m_->weights()),
      state_(c_),
      slot_(static_cast<size_t>(state_.mla_slot(m_->layer()))) {}

std::span<const float> MtpDrafter::cache_rows() const {
  return state_.mla()[slot_].rows;
}

void MtpDrafter::replace_cache_rows(std::vector<float> rows, int64_t count) {
  state_.reset();  // keeps the allocations
  if (count > 0) state_.mla()[slot_].rows = std::move(rows);
  state_.set_position(count);
}

void MtpDrafter::layer_input(std::span<const int32_t> tokens, const float* h, float* x) {
  const int64_t H = c_.hidden, R = static_cast<int64_t>(tokens.size());
  std::vector<float> e(static_cast<size_t>(H)), u(static_cast<size_t>(R * 2 * H));
  for (int64_t r = 0; r < R; ++r) {
    const int32_t t = tokens[static_cast<size_t>(r)];
    if (t < 0 || t >= c_.vocab)
      fail("token id {} is outside the vocabulary (0..{})", t, c_.vocab - 1);
    mtp_embed_row(w_.embed, t, e.data());
    ops::rmsnorm(e.data(), w_.enorm.data(), c_.rms_eps, H, u.data() + r * 2 * H);
    ops::rmsnorm(h + r * H, w_.hnorm.data(), c_.rms_eps, H, u.data() + r * 2 * H + H);
  }
  kernels::matmul(w_.eh_proj, u.data(), R, 2 * H, x, H, target_.pool());
}

// The decoder layer exactly as Model::forward runs a pre-norm MLA + MoE layer:
// x += MLA(RMSNorm(x; input_layernorm)); x += MoE(RMSNorm(x; post_attention_layernorm)).
void MtpDrafter::run_layer(float* x, int64_t R, bool ffn) {
  const int64_t H = c_.hidden;
  SeqRows s;
  s.begin = 0;
  s.count = R;
  s.state = &state_;
  s.base = state_.position();
  s.pass_count = R;
  const LayerContext ctx{c_, target_.pool(), std::span<const SeqRows>(&s, 1), R, nullptr};
  const LayerWeights& w = w_.layer;
  std::vector<float> u(static_cast<size_t>(R * H)), y(u.size());
  for (int64_t r = 0; r < R; ++r)
    ops::rmsnorm(x + r * H, w.input_norm.data(), c_.rms_eps, H, u.data() + r * H);
  mla_forward(ctx, w.mla, m_->layer(), u.data(), y.data());
  state_.set_position(s.base + R);
  if (!ffn) return;
  for (int64_t i = 0; i < R * H; ++i) x[i] += y[static_cast<size_t>(i)];
  for (int64_t r = 0; r < R; ++r)
    ops::rmsnorm(x + r * H, w.post_norm.data(), c_.rms_eps, H, u.data() + r * H);
  moe_forward(ctx, w.moe, m_->experts(), m_->layer(), u.data(), y.data());
  for (int64_t i = 0; i < R * H; ++i) x[i] += y[static_cast<size_t>(i)];
}

void MtpDrafter::commit_rows(std::span<const int32_t> history) {
  const int64_t H = c_.hidden;
  const int64_t L = static_cast<int64_t>(history.size()) - 1;  // committed positions
  TapRecorder& rec = taps();
  const int64_t held_end = first_unheld(L);
  for (int64_t p = held_end; p < L; ++p) tail_.insert(tail_.end(), rec.row(p), rec.row(p) + H);
  rec.consume_until(L);
  const int64_t n = L - 1 - cache_len_;  // rows (h_p, t_{p+1}) for p = cache_len_ .. L-2
  if (n <= 0) return;
  std::vector<float> x(static_cast<size_t>(n * H));
  layer_input(history.subspan(static_cast<size_t>(cache_len_ + 1), static_cast<size_t>(n)),
              tail_.data(), x.data());
  run_layer(x.data(), n, false);
  cache_len_ += n;
  tail_.erase(tail_.begin(), tail_.begin() + n * H);
}

DraftProposal MtpDrafter::draft(std::span<const int32_t> history, int max_tokens) {
  commit_rows(history);
  const int64_t H = c_.hidden, V = c_.vocab;
  DraftProposal out;
  std::vector<float> h(tail_.begin(), tail_.begin() + H);  // h_{L-1}
  std::vector<float> x(static_cast<size_t>(H)), xn(x.size());
  int32_t t = history.back();
  const int64_t room = c_.max_positions > 0 ? c_.max_positions - cache_len_ : max_tokens;
  const int64_t steps = std::min<int64_t>(max_tokens, room);
  for (int64_t j = 0; j < steps; ++j) {
    layer_input(std::span<const int32_t>(&t, 1), h.data(), x.data());
    run_layer(x.data(), 1, true);  // x' at position cache_len_ + j
    ops::rmsnorm(x.data(), w_.head_norm.data(), c_.rms_eps, H, xn.data());
    last_logits_.resize(last_logits_.size() + static_cast<size_t>(V));
    float* logits = last_logits_.data() + last_logits_.size() - V;
    kernels::matmul(w_.head, xn.data(), 1, H, logits, V, target_.pool());
    t = argmax_row(std::span<const float>(logits, static_cast<size_t>(V)));
    out.tokens.push_back(t);
    h = x;  // the chain's next hidden: x' before shared_head.norm
  }
  state_.truncate(cache_len_);  // chain rows are dropped
  return out;
}

}  // namespace deltafin
