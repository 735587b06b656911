// A draft model's tensors as its release lays them out (EAGLE-3 / 3.1 and DSpark), and the
// published drafter's shape for a target: what `make-model --drafter` writes and what `doctor`
// counts when it forecasts drafting for a model that has no draft/ folder yet.
#pragma once

#include <cstdint>
#include <vector>

#include "draft/draft_config.h"
#include "model/config.h"
#include "model/inventory.h"

namespace deltafin {

// Every tensor a draft of this config holds, as released (embed_tokens included).
std::vector<ExpectedTensor> draft_tensors(const DraftModelConfig& c);

// The bytes of a draft's weights; without embed_tokens (the release's copy of the target's table,
// which the engine never reads) when `with_embeddings` is false.
uint64_t draft_weight_bytes(const DraftModelConfig& c, bool with_embeddings);

// The published EAGLE-3.1 drafter's shape for `target` (lightseekorg/kimi-k3-eagle3.1-mla for
// K3): one MLA decoder layer at the target's attention widths over a 2H input, an MLP of 2H, taps
// at the first, middle and last-but-one layers fused by `fc` after an RMSNorm each, and an
// lm_head over the target's vocabulary.
DraftModelConfig eagle31_shape(const ModelConfig& target);

}  // namespace deltafin
