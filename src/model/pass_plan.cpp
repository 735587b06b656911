// Sizes of the prefill arrangement (pass_plan.h). The byte counts follow the buffers the layer
// code allocates (model.cpp, attn_residual.cpp, kda.cpp, mla.cpp, moe.cpp); when one of those
// changes shape, this is the one place that must follow, so the planner's figure stays what a pass
// really holds.
#include "model/pass_plan.h"

#include <fmt/format.h>

#include <algorithm>

namespace deltafin {

std::string PassPlan::describe() const {
  return fmt::format("prefill passes of up to {} rows{} in blocks of {} rows", pass_rows,
                     automatic ? " (auto)" : " (as set)", block_rows);
}

int64_t pass_block_rows(int64_t pass_rows) {
  const int64_t q = kPassBlockQuantum;
  return std::min(kDefaultBlockRows, (std::max<int64_t>(pass_rows, 1) + q - 1) / q * q);
}

PassRowBytes pass_row_bytes(const ModelConfig& c) {
  const int64_t H = c.hidden;
  const int64_t anchors = c.residual == ResidualForm::kAttnRes
                              ? (c.num_layers + c.attn_res_block - 1) / c.attn_res_block
                              : 0;
  const bool moe = c.num_moe_layers() > 0;
  const int64_t k = c.moe.top_k, Hl = c.expert_dim(), I = c.moe.intermediate;
  // Whole pass: anchors + partial sum, the token; the MoE's latent inputs, routing and the
  // per-(row, slot) expert outputs summed in id order once every expert has run.
  int64_t held = H * (anchors + 1) + 1;
  if (moe) held += Hl * (k + 1) + 2 * k;
  // One block: the mix / norm / output rows, plus the largest of the sub-layers' buffers.
  const int64_t Pk = c.kda.proj_dim(), nh = c.kda.num_heads;
  const int64_t kda = 10 * Pk + 2 * nh + c.kda.head_dim;
  const MlaConfig& m = c.mla;
  const int64_t mla = m.q_lora_rank + 2 * m.num_heads * m.q_head_dim() + m.cache_width() +
                      2 * m.num_heads * m.v_head_dim;
  const int64_t mlp = 2 * std::max(c.dense_intermediate, c.moe.shared_intermediate());
  const int64_t experts =
      moe ? c.moe.num_experts + 3 * Hl + 2 * I + 2 * c.moe.shared_intermediate() : 0;
  const int64_t scratch = 3 * H + std::max({kda, mla, mlp, experts});
  return {static_cast<uint64_t>(held) * 4, static_cast<uint64_t>(scratch) * 4};
}

uint64_t pass_bytes(const ModelConfig& c, int64_t pass_rows, int64_t block_rows) {
  const PassRowBytes b = pass_row_bytes(c);
  const int64_t block = std::min(pass_rows, block_rows);
  return b.held * static_cast<uint64_t>(pass_rows) + b.scratch * static_cast<uint64_t>(block);
}

}  // namespace deltafin
