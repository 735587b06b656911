// `deltafin inspect`: what a checkpoint is — architecture and layer schedule, parameter counts,
// bytes of trunk and experts, the bytes a decoded token reads — and what the inventory check
// found. Exits 1 (after printing the findings) if the checkpoint is unusable. Every family: K3,
// Kimi-Linear, DeepSeek-V3 / Kimi K2 (FP8 and INT4 weights counted as parameters, not bytes).
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "model/config.h"
#include "model/inventory.h"
#include "storage/checkpoint.h"
#include "storage/trunk_units.h"

namespace deltafin::cli {

namespace {

std::string count_params(uint64_t n) {
  if (n >= 1000000000ull) return fmt::format("{:.3f} B", n / 1e9);
  if (n >= 1000000ull) return fmt::format("{:.3f} M", n / 1e6);
  return fmt::format("{}", n);
}

struct InspectArgs {
  std::string model;
  bool json = false;
};

void run_inspect(InspectArgs& a) {
  a.model = resolve_model_dir(a.model);
  ModelConfig c = load_config(a.model);
  auto ck = Checkpoint::open(a.model);
  std::string inventory_error;
  InventoryReport rep;
  try {
    rep = check_inventory(c, *ck);
  } catch (const Error& e) {
    inventory_error = e.what();
  }

  // Parameters and bytes from the tensors actually present. Packed weights hold several
  // parameters per element (MXFP4: two per byte; INT4: eight per I32 word); scales and INT4's
  // logical shapes are not parameters. A DeepSeek-V3 MTP layer (a drafter's) is counted apart.
  uint64_t trunk_params = 0, trunk_bytes = 0, expert_params = 0, expert_bytes = 0;
  uint64_t embed_params = 0, head_params = 0, head_bytes = 0, embed_row_bytes = 0, vision_count = 0;
  uint64_t one_expert_bytes = 0, one_expert_params = 0, mtp_params = 0, mtp_bytes = 0;
  const std::string mtp_prefix = c.mtp_layers > 0 ? c.names.layer(c.num_layers) : std::string("\n");
  for (const auto& [name, t] : ck->tensors()) {
    const uint64_t n = static_cast<uint64_t>(t.numel());
    const uint64_t params =
        name.ends_with("weight_packed") ? (t.dtype == DType::kI32 ? 8 * n : 2 * n)
        : name.ends_with("weight_scale") || name.ends_with("weight_scale_inv") ||
                name.ends_with("weight_shape")
            ? 0
            : n;
    if (name.starts_with(mtp_prefix)) {
      mtp_params += params;
      mtp_bytes += t.nbytes;
    } else if (is_routed_expert_tensor(name)) {
      expert_params += params;
      expert_bytes += t.nbytes;
      if (name.starts_with(expert_prefix(c, c.first_k_dense, 0))) {
        one_expert_bytes += t.nbytes;
        one_expert_params += params;
      }
    } else if (name == c.names.embed()) {
      embed_params = n;
      embed_row_bytes = t.nbytes / static_cast<uint64_t>(std::max<int64_t>(1, t.shape[0]));
    } else if (name == c.names.lm_head()) {
      head_params = n;
      head_bytes = t.nbytes;
    } else if (name.rfind(c.names.prefix, 0) == 0 && !name.ends_with("rotary_emb.inv_freq")) {
      trunk_params += params;
      trunk_bytes += t.nbytes;
    } else {
      ++vision_count;
    }
  }
  if (c.tie_embeddings) head_bytes = embed_params * 2;
  const uint64_t active_experts = static_cast<uint64_t>(c.moe.top_k * c.num_moe_layers());
  const uint64_t per_token =
      trunk_bytes + head_bytes + embed_row_bytes + active_experts * one_expert_bytes;
  const uint64_t active_params = trunk_params + (c.tie_embeddings ? embed_params : head_params) +
                                 static_cast<uint64_t>(c.hidden) +
                                 active_experts * one_expert_params;

  std::string sched;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    sched += c.is_mla(i) ? 'M' : 'K';
  }
  fmt::print("model        {}\n", a.model);
  const std::string arch = c.family == Family::kK3 ? "Kimi K3 (KimiK3ForConditionalGeneration)"
                           : c.family == Family::kKimiLinear ? "Kimi-Linear (KimiLinearForCausalLM)"
                           : c.model_type == "kimi_k25"
                               ? "Kimi K2.5 (KimiK25ForConditionalGeneration, its text model)"
                           : c.model_type == "deepseek_v3" ? "DeepSeek-V3 (DeepseekV3ForCausalLM)"
                                                           : "Kimi K2 (DeepseekV3ForCausalLM)";
  fmt::print("architecture {}: hidden {}, {} layers ({} KDA, {} MLA), vocab {}\n", arch, c.hidden,
             c.num_layers, c.num_kda_layers(), c.num_mla_layers(), c.vocab);
  fmt::print("schedule     {} (K = KDA, M = MLA; layers 0..{} dense, the rest MoE)\n", sched,
             c.first_k_dense - 1);
  if (c.num_kda_layers() > 0) {
    fmt::print("KDA          {} heads x {}, conv {}, {}, f_a rank {}{}\n", c.kda.num_heads,
               c.kda.head_dim, c.kda.conv_kernel,
               c.kda.decay == KdaDecay::kSoftplus
                   ? std::string("decay -exp(A_log)*softplus (unbounded)")
                   : fmt::format("gate lower bound {}", c.kda.gate_lower_bound),
               rep.f_a_rank, c.kda.low_rank_output_gate ? ", low-rank output gate" : "");
  }
  const auto& rp = c.mla.rope;
  const std::string rope = !rp.enabled ? std::string("unrotated")
                           : rp.factor > 1.0
                               ? fmt::format("YaRN: theta {}, factor {}, beta {}/{}", rp.theta,
                                             rp.factor, rp.beta_fast, rp.beta_slow)
                               : fmt::format("RoPE: theta {}", rp.theta);
  fmt::print(
      "MLA          {} heads, q_lora {}, kv_lora {}, nope {} + rope {} ({}), v {}, output "
      "gate {}\n",
      c.mla.num_heads, c.mla.q_lora_rank, c.mla.kv_lora_rank, c.mla.qk_nope_dim, c.mla.qk_rope_dim,
      rope, c.mla.v_head_dim, c.mla.output_gate ? "on" : "off");
  if (c.moe.num_groups > 1) {
    fmt::print("router       {} groups of {} experts, the best {} groups compete\n",
               c.moe.num_groups, c.moe.num_experts / c.moe.num_groups, c.moe.topk_groups);
  }
  fmt::print(
      "MoE          {} routed experts, top {}, {} shared; experts work in a {}-wide {} with "
      "intermediate {}; "
      "scaling {}; dense intermediate {}\n",
      c.moe.num_experts, c.moe.top_k, c.moe.num_shared_experts, c.expert_dim(),
      c.moe.flavour == MoeFlavour::kLatent ? "latent" : "hidden row", c.moe.intermediate,
      c.moe.routed_scaling_factor, c.dense_intermediate);
  if (c.residual == ResidualForm::kAttnRes) {
    fmt::print("AttnRes      block size {}, {} anchors banked\n", c.attn_res_block,
               (c.num_layers + c.attn_res_block - 1) / c.attn_res_block);
  } else {
    fmt::print("residual     pre-norm (no Attention Residuals)\n");
  }
  fmt::print("experts      {} ({} per expert, {} params each){}\n",
             expert_format_name(c.expert_format()),
             human_bytes(static_cast<double>(one_expert_bytes)), one_expert_params,
             c.fp8_trunk ? "; trunk linears FP8 E4M3 (128x128 block scales)" : "");
  if (c.mtp_layers > 0) {
    fmt::print("MTP          {} layer(s) after the decoder: {} parameters, {} (a drafter's)\n",
               c.mtp_layers, count_params(mtp_params), human_bytes(static_cast<double>(mtp_bytes)));
  }
  const auto count = count_params;
  fmt::print("parameters   total {}: trunk {}, embedding {}, lm_head {}, routed experts {}\n",
             count(trunk_params + embed_params + head_params + expert_params), count(trunk_params),
             count(embed_params), count(head_params), count(expert_params));
  fmt::print("active       {} parameters per token\n", count(active_params));
  fmt::print("bytes        files {}, trunk {} (+ lm_head {}), routed experts {}\n",
             human_bytes(static_cast<double>(ck->total_bytes())),
             human_bytes(static_cast<double>(trunk_bytes)),
             human_bytes(static_cast<double>(head_bytes)),
             human_bytes(static_cast<double>(expert_bytes)));
  fmt::print(
      "per token    {} read per decoded token with nothing cached (trunk + head + {} experts)\n",
      human_bytes(static_cast<double>(per_token)), active_experts);
  fmt::print("shards       {} files, {} tensors ({} of them vision tower / projector)\n",
             ck->shards().size(), ck->tensors().size(), vision_count);
  if (inventory_error.empty()) {
    fmt::print("inventory    OK: {} tensors match the config{}\n", rep.checked,
               rep.vision ? fmt::format(" ({} of the vision tower and projector, checked against "
                                        "vision_config)",
                                        rep.vision_tensors)
                          : std::string());
  } else {
    fmt::print("inventory    FAILED\n{}\n", inventory_error);
    throw Error("the checkpoint's tensors do not match its config (see above)");
  }
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  auto* cmd = app.add_subcommand("inspect", "Describe a checkpoint and check its tensor inventory");
  cmd->add_option("--model", args->model,
                  "Model folder (default: $DELTAFIN_MODEL, else the built-in demo)");
  cmd->callback([args] { run_inspect(*args); });
}

}  // namespace deltafin::cli
