// K3's vision tower configuration: `vision_config` of config.json (docs/VISION.md §2.1), and the
// vision tensors a checkpoint must hold for it (§4.1). A missing field takes the public ports'
// default (the release value); a value this engine does not implement is refused with an error
// naming the field; Hugging Face bookkeeping keys (model_type, dtype, id2label, …) are ignored.
//
// A checkpoint is a vision checkpoint when it holds `vision_tower.*` / `mm_projector.*` tensors;
// only then is vision_config read (check_inventory). The text-only checkpoints — make-model's
// without --vision, the golden tiny models, the demo — carry a placeholder vision_config that is
// never parsed, so they load exactly as before.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/inventory.h"

namespace deltafin {

// The epsilon of the tower's 55 RMSNorms (norm0, norm1, final_layernorm). The checkpoint builds
// them as torch.nn.RMSNorm(D) without eps, which PyTorch ≥ 2.7 — the PyTorch of every engine
// serving K3 — resolves to the float32 machine epsilon 2^-23 for bf16 and float32 inputs alike
// (docs/VISION.md §5, with the measured effect of 2^-7 instead). The projector's post_norm uses
// projector_ln_eps (1e-5) from the config.
inline constexpr float kVisionTowerNormEps = 0x1p-23f;

enum class PosInterpolation { kBilinear, kBicubic };
enum class VisionActivation { kGeluTanh, kGeluErf };

struct VisionConfig {
  std::string path;  // the config.json read
  int64_t patch = 14;
  int64_t pos_h = 64, pos_w = 64, pos_t = 4;
  int64_t hidden = 1024;  // D
  int64_t heads = 12;
  int64_t layers = 27;
  int64_t intermediate = 4096;
  int64_t qkv = 1536;  // Q: head_dim = Q / heads
  int64_t merge_h = 2, merge_w = 2;
  int64_t text_hidden = 7168;
  PosInterpolation pos_interpolation = PosInterpolation::kBilinear;
  VisionActivation activation = VisionActivation::kGeluTanh;
  bool attn_bias = false, linear_bias = false, patch_bias = false;
  float projector_eps = 1e-5f;
  float tower_norm_eps = kVisionTowerNormEps;
  // config.json's media_placeholder_token_id (top level; release 163605, <|media_pad|>): the
  // prompt token whose embedding rows an image's projector rows replace (§6).
  int64_t placeholder_id = 163605;

  int64_t head_dim() const { return qkv / heads; }
  int64_t patch_dim() const { return 3 * patch * patch; }
  int64_t merged_dim() const { return hidden * merge_h * merge_w; }
};

// Parses a vision_config object. `text_hidden` is text_config.hidden_size (-1: no text model in
// the folder); text_hidden_size must equal it. Throws InvalidArgument listing every problem.
VisionConfig parse_vision_config(const nlohmann::json& vision_config, int64_t text_hidden,
                                 const std::string& path);
// The vision_config of a whole config.json text (a K3 config; text_config optional).
VisionConfig parse_vision_config_text(const std::string& config_json, const std::string& path);
// The vision_config of a parsed model config (ModelConfig keeps the object's text).
VisionConfig vision_config_of(const ModelConfig& c);

// Whether a tensor name belongs to the vision tower or the projector.
bool is_vision_tensor(const std::string& name);
// Every vision tensor the config implies (§4.1), BF16 as released; layer = block index.
std::vector<ExpectedTensor> expected_vision_tensors(const VisionConfig& v);
// Checks a checkpoint's vision tensors alone against the config (a folder that holds only the
// tower, or the tower of a full checkpoint): throws one Error listing every missing, extra,
// wrongly-shaped or wrongly-typed one.
void check_vision_inventory(const VisionConfig& v, const TensorTable& tensors,
                            const std::string& dir);

}  // namespace deltafin
