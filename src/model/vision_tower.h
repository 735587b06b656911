// K3's vision tower (MoonViT3d) and projector (PatchMergerMLPV2): a pixel tensor in, one row of
// the text model's width per merged token out (docs/VISION.md §4). It reads like the doc: patch
// embedding, interpolated position embedding (+ time embedding for several frames), the encoder
// layers (RMSNorm → wqkv → 2-D RoPE → full attention → wo; RMSNorm → fc0 → GELU → fc1), the final
// norm, the 2×2 merger with the mean over frames, the projector.
//
// Exactness as the text model: activations float32, weights BF16 as released (decoded in the
// kernels), norms' statistics in double, the position-embedding interpolation, RoPE angles and
// time table computed in double and rounded once. Matrix products go through kernels::matmul on
// the caller's pool, so the result does not depend on the thread count.
//
// Memory: the residual stream [n, D] and each layer's rotated keys and values [2, n, Q] live
// for the whole input; everything else (queries, scores, MLP activations) is computed for a block
// of rows at a time, and attention scores for a few query rows per task (never the n × n
// matrix). For the release at the largest input (67,268 patches) that is about 1.1 GB.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/vision_config.h"
#include "model/weights.h"
#include "tensor/matrix.h"

namespace deltafin {

struct VisionBlockWeights {
  std::vector<float> norm0, norm1;
  Matrix wqkv, wo, fc0, fc1;
  std::vector<float> wqkv_bias, wo_bias, fc0_bias, fc1_bias;  // empty without the bias flags
};

struct VisionWeights {
  Matrix patch_proj;  // proj.weight viewed as [D, 3·P·P] (§4.2)
  std::vector<float> patch_bias;
  std::vector<float> pos_emb;  // [pos_h][pos_w][D]
  std::vector<VisionBlockWeights> blocks;
  std::vector<float> final_norm;
  Matrix proj0, proj2;  // mm_projector.proj.0 / proj.2
  std::vector<float> post_norm;
};

// Binds the vision tensors (names and shapes of expected_vision_tensors, checked): matrices are
// zero-copy views of the checkpoint's bytes, vectors fp32 copies. Throws naming the tensor.
VisionWeights bind_vision(const VisionConfig& v, const TensorLookup& lookup);

// The patch grid of one input: `frames` frames of grid_h × grid_w patches (grid_thw).
struct VisionGrid {
  int64_t frames = 1, h = 0, w = 0;
  int64_t patches() const { return frames * h * w; }
};

// Called with each intermediate the reference can dump (tools/vision/k3_vision_ref.py --dump):
// "patch_embed", "embed", "block{i}", "final_norm", "merged", "projector_pre_norm".
using VisionTap =
    std::function<void(const std::string& name, const float* data, int64_t rows, int64_t cols)>;

class VisionTower {
 public:
  VisionTower(VisionConfig config, VisionWeights weights);

  const VisionConfig& config() const { return config_; }
  // Merged tokens of an input (the projector's rows): (h / merge_h) · (w / merge_w).
  int64_t tokens(const VisionGrid& g) const;
  // Throws InvalidArgument unless the grid fits the tower (frames ≤ init_pos_emb_time, sides
  // multiples of the merge kernel and at most 4096 patches).
  void check_grid(const VisionGrid& g) const;

  // pixels [g.patches()][3·P·P] (docs/VISION.md §3.7) → [tokens(g)][text_hidden], row-major.
  std::vector<float> forward(const float* pixels, const VisionGrid& g, ThreadPool& pool,
                             const VisionTap& tap = {}) const;

 private:
  VisionConfig config_;
  VisionWeights w_;
};

// docs/VISION.md §4.3: the learnable position grid [pos_h][pos_w][D] resized to [h·w][D] with the
// interpolation mode (bilinear or PyTorch's bicubic, align_corners false), in double.
// What the tower costs (docs/VISION.md §11.8): its parameters, the RAM its weights take once
// bound, the working memory of one input and the arithmetic of one forward. Computed from the
// config alone (the released shape has no checkpoint on disk for `deltafin doctor`).
struct VisionCost {
  int64_t tower_params = 0;      // vision_tower.* (the release: 401.2 M)
  int64_t projector_params = 0;  // mm_projector.* (the release: 46.1 M)
  // As bound (bind_vision): the BF16 bytes of every tensor (the matrices are views of the
  // checkpoint's mapping, read for every image, so they stay in RAM) plus the float32 copies of
  // the vectors and the position grid.
  uint64_t weight_bytes = 0;
};
VisionCost vision_cost(const VisionConfig& v);

// Peak bytes of one forward over `patches` patches of one frame, as VisionTower::forward
// allocates them, with the caller's pixel tensor (float32, plus the padded uint8 image the
// processor keeps beside it) and the output rows: the residual stream, the interpolated position
// grid (double), the keys and values of one layer, the rotation tables, the per-block scratch and
// `threads` tasks' attention scores. Decoding and resizing come before and are freed before the
// tower runs (docs/VISION.md §11.2 bounds them).
uint64_t vision_work_bytes(const VisionConfig& v, int64_t patches, int threads);

// Floating-point operations of one forward over the grid `g`: the products with the weights
// (patch embedding, every layer's wqkv, wo, fc0, fc1, the projector: 2 per weight per row) and
// attention's two products per head (scores and values against every key).
struct VisionFlops {
  double linear = 0, attention = 0;
  double total() const { return linear + attention; }
};
VisionFlops vision_flops(const VisionConfig& v, const VisionGrid& g);

std::vector<double> interpolate_pos_emb(const std::vector<float>& grid, int64_t pos_h,
                                        int64_t pos_w, int64_t dim, int64_t h, int64_t w,
                                        PosInterpolation mode);

}  // namespace deltafin
