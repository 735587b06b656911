// Synthetic checkpoints in the exact release layout (`deltafin make-model`): config.json with the
// K3 fields, `language_model.` tensor names, several safetensors shards plus the index, each
// routed expert's six tensors back to back (experts shuffled within a layer, as in the release),
// MXFP4 packing, padded A_log, and a small tokenizer. Weights are random but deterministic in the
// seed and independent of thread count. Shards are generated and written in chunks (generation
// of one chunk overlaps the write of the previous one), so a multi-GB model never sits in RAM.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/inventory.h"

namespace deltafin {

struct SyntheticSpec {
  int64_t hidden = 256;
  int64_t layers = 9;
  int64_t vocab = 512;
  int64_t dense_intermediate = 512;
  int64_t first_k_dense = 1;
  int64_t attn_res_block = 3;
  std::vector<int64_t> mla_layers;  // 1-based; empty = every 4th layer and the last (K3's rule)
  int64_t kda_heads = 6, kda_head_dim = 32, conv_kernel = 4;
  int64_t mla_heads = 6, q_lora = 64, kv_lora = 32, qk_nope = 32, qk_rope = 16, v_head = 32;
  int64_t experts = 32, top_k = 4, shared_experts = 2, moe_intermediate = 64, latent = 128;
  double routed_scaling = 1.0;
  double situ_beta = 4.0, situ_linear_beta = 25.0;
  int64_t max_positions = 4096;
  ExpertFormat expert_format = ExpertFormat::kMXFP4;
  uint64_t seed = 1;
  uint64_t shard_bytes = 4ull << 20;  // target shard size
  bool tokenizer = true;
};

SyntheticSpec synthetic_preset(const std::string& name);  // "tiny" or "k3"; throws otherwise

struct MakeModelProgress {
  uint64_t bytes_written = 0;
  uint64_t bytes_total = 0;
  double seconds = 0;
};

struct MakeModelResult {
  uint64_t bytes = 0;
  int shards = 0;
  size_t tensors = 0;
  double seconds = 0;
};

// The config.json text for a spec (also used by tests that vary fields).
std::string synthetic_config_json(const SyntheticSpec& spec);

// Writes the checkpoint into `out_dir` (created; must not already contain a checkpoint).
MakeModelResult make_model(const std::string& out_dir, const SyntheticSpec& spec,
                           const std::function<void(const MakeModelProgress&)>& progress = {});

// Writes a folder of `tensors` with random values (the same generator: norms around 1, matrices
// of std 0.02, deterministic in `seed`) as one model.safetensors plus `config_text` as
// config.json — the layout draft models are released in (`make-model --draft`).
MakeModelResult write_random_checkpoint(const std::string& out_dir, const std::string& config_text,
                                        const std::vector<ExpectedTensor>& tensors, uint64_t seed);

}  // namespace deltafin
