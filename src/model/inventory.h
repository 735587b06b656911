// The tensors a checkpoint must hold, derived from its config: names, shapes and dtypes as in
// the release (K3: docs/MODEL.md §2.2; Kimi-Linear: docs/FAMILY.md KL.3). The loader checks a
// checkpoint against this list before any compute and reports every missing, extra, wrongly-shaped
// or wrongly-typed tensor in one error; make-model writes exactly this list.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"
#include "tensor/dtype.h"
#include "tensor/tensor_info.h"

namespace deltafin {

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype;
  int layer = -1;   // -1 for globals
  int expert = -1;  // routed expert id, -1 for trunk tensors
  // The [rows, cols] of the weight a quantised tensor belongs to (the packed codes, the scales
  // and INT4's weight_shape, which holds these values); empty for plain tensors.
  std::vector<int64_t> logical = {};
};

// Names (the family's prefix included: K3 `language_model.model.layers.N.`, Kimi-Linear
// `model.layers.N.`): c.names.layer / c.names.expert.
std::string layer_prefix(const ModelConfig& c, int64_t layer);
std::string expert_prefix(const ModelConfig& c, int64_t layer, int64_t expert);
// Whether a tensor name is a routed expert's (`...block_sparse_moe.experts.E.`,
// `...mlp.experts.E.`), not the trunk's.
bool is_routed_expert_tensor(const std::string& name);

struct InventoryOptions {
  ExpertFormat expert_format = ExpertFormat::kMXFP4;
  int64_t f_a_rank = 0;  // KDA f_a_proj rank; 0 = head_dim
  int64_t g_a_rank = 0;  // KDA g_a_proj rank (low-rank output gate); 0 = head_dim
  // DeepSeek-V3 / K2: every trunk linear FP8 E4M3 with its F32 weight_scale_inv (the MTP layer's
  // eh_proj stays BF16; check_inventory also accepts it FP8).
  bool fp8_trunk = false;
};

// Everything the config implies, in release order (per layer: trunk tensors, then experts; a
// DeepSeek-V3 checkpoint's MTP layers after the decoder layers, before the final norm).
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c, const InventoryOptions& o);

// One tensor of a routed expert: its name suffix after the expert's prefix, which matrix it
// belongs to (0: gate, w1; 1: down, w2; 2: up, w3) and what it holds of it (kWeight: the weight
// or its packed codes; kScale: the MXFP4 / INT4 group scales or the FP8 block scales; kShape:
// INT4's logical [rows, cols]).
enum class ExpertPart { kWeight, kScale, kShape };
struct ExpertTensor {
  std::string suffix;
  int matrix = 0;
  ExpertPart part = ExpertPart::kWeight;
};
// A routed expert's tensors in their on-disk order for the family's names and a format (K3 MXFP4:
// w1.weight_packed, w1.weight_scale, w2..., w3...; BF16: w1.weight, w2.weight, w3.weight;
// DeepSeek-V3 / K2: gate_proj, up_proj, down_proj, each .weight (+ .weight_scale_inv for FP8) or
// .weight_packed, .weight_scale, .weight_shape for INT4).
std::vector<ExpertTensor> expert_tensors(const ModelConfig& c, ExpertFormat f);
std::vector<std::string> expert_tensor_suffixes(const ModelConfig& c, ExpertFormat f);
// The block-scale tensor of an FP8 weight `X.weight`: `X.weight_scale_inv`, F32
// [ceil(rows/128), ceil(cols/128)].
std::vector<int64_t> fp8_scale_shape(const std::vector<int64_t>& weight_shape);

struct InventoryReport {
  ExpertFormat expert_format = ExpertFormat::kMXFP4;
  int64_t f_a_rank = 0;
  size_t checked = 0;
  // The vision tower and projector (model/vision_config.h): present when the checkpoint holds
  // vision_tower.* / mm_projector.* tensors, which are then checked against vision_config.
  bool vision = false;
  size_t vision_tensors = 0;
  size_t ignored = 0;  // K3: language_model.vision_tower.* / .mm_projector.*; K2.5's tower;
                       // DeepSeek's rotary_emb.* extras
};

// A checkpoint's tensors by name.
using TensorTable = std::map<std::string, TensorInfo>;

// Checks the tensors of the checkpoint in `dir` against the config; throws one Error listing
// every problem (grouped, with counts). Vision tensors, when there are any, are checked against
// the config's vision_config (an invalid vision_config is an error then).
InventoryReport check_inventory(const ModelConfig& c, const TensorTable& tensors,
                                const std::string& dir);

}  // namespace deltafin
