// A draft model's config.json, as released, read into one struct for both kinds K3 has
// (docs/DRAFT-MODELS.md): EAGLE-3 / 3.1 (`Eagle3DeepseekV2ForCausalLM`, one MLA layer over its own
// cache, its own lm_head) and DSpark (`K3DSparkModel`, context injection, a non-causal block,
// Markov head and confidence head, the target's lm_head). The kind is read from the file, never
// guessed from a folder name; what differs between checkpoints of a kind (EAGLE 3.0 vs 3.1,
// Inferact vs lightseek DSpark) is a flag here, not a second code path. Errors name the file and
// the field and list every problem at once, like the target's config.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/taps.h"

namespace deltafin {

// kMtp: DeepSeek-V3's MTP layer of the target itself (draft/mtp.h), not read from a folder.
enum class DraftKind { kEagle3, kDSpark, kMtp };
const char* draft_kind_name(DraftKind k);

// DeepSeek-V3 YaRN (rope_scaling / rope_parameters). factor 1 = plain RoPE.
struct YarnConfig {
  double theta = 10000.0;
  double factor = 1.0;
  double original_max_positions = 0;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 1.0, mscale_all_dim = 0.0;
};

struct DraftModelConfig {
  std::string path;  // the config.json read
  DraftKind kind = DraftKind::kEagle3;
  int64_t hidden = 0, intermediate = 0, num_layers = 0, vocab = 0;
  MlaConfig mla;  // output_gate is always false for drafts
  float rms_eps = 1e-5f;
  int64_t max_positions = 0;
  YarnConfig yarn;
  TapSpec taps;
  bool fc_norm = false;  // an RMSNorm per tap before fusing (EAGLE-3.1, lightseek DSpark)
  // EAGLE: the hidden fed to the next chain step is the normed y (3.1) rather than the pre-norm r.
  bool norm_output = false;
  // DSpark
  int64_t mask_token_id = -1;
  int64_t block_size = 7;  // [anchor, mask × 6]: the release has no field for it
  int64_t markov_rank = 0;
  bool confidence_head = false, confidence_with_markov = false;
  int64_t target_layers = 0;  // target_num_hidden_layers when the config states it (DSpark)
};

// Parses config.json text (`path` in messages); throws Error listing every problem.
DraftModelConfig parse_draft_config(const std::string& json_text, const std::string& path);
DraftModelConfig load_draft_config(const std::string& dir);
// Refuses a draft that does not fit the target: hidden size, vocabulary, the target's layer
// count when the draft states it, tap layers.
void check_draft_matches(const DraftModelConfig& d, const ModelConfig& target);

}  // namespace deltafin
