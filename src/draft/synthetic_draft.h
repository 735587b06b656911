// Synthetic draft models (`deltafin make-model OUT --drafter KIND --target DIR`): a draft folder
// in the release layout (config.json with the release's field names + one model.safetensors of
// BF16 tensors, embed_tokens copy included) sized for a given target: its hidden size,
// vocabulary and MLA shape, taps spread over its layers. Random weights make the drafts
// useless as predictions but exercise every path — loading, taps, caches, verification — at any
// size, up to K3's, for tests and for measuring what a drafter costs.
#pragma once

#include <string>
#include <vector>

#include "draft/draft_config.h"
#include "engine/synthetic.h"
#include "model/config.h"
#include "model/inventory.h"

namespace deltafin {

struct SyntheticDraftSpec {
  DraftKind kind = DraftKind::kEagle3;
  bool v31 = true;        // EAGLE-3.1 (fc_norm + norm_output) rather than 3.0
  int64_t layers = 2;     // DSpark draft layers (EAGLE has one)
  std::vector<int> taps;  // empty: spread over the target (first, middle, last but one)
  TapStream stream = TapStream::kPartial;
  uint64_t seed = 1;
};

// "eagle3.1", "eagle3" or "dspark"; throws InvalidArgument otherwise.
SyntheticDraftSpec synthetic_draft_preset(const std::string& kind);
std::string synthetic_draft_config_json(const SyntheticDraftSpec& s, const ModelConfig& target);
// Every tensor a draft of this config holds, as released (embed_tokens included).
std::vector<ExpectedTensor> draft_tensors(const DraftModelConfig& c);
MakeModelResult make_draft_model(const std::string& out_dir, const SyntheticDraftSpec& s,
                                 const ModelConfig& target);

}  // namespace deltafin
