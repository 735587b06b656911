// DeepSeek-V3's rotary position encoding of MLA's qk_rope slice, with YaRN (docs/FAMILY.md "RoPE:
// YaRN on interleaved pairs"): pairs (x[2i], x[2i+1]) rotated by position · inv_freq[i], the
// frequencies blended between θ^(−2i/d) and θ^(−2i/d)/factor by YaRN's ramp, cos and sin scaled by
// the mscale ratio, and the softmax scale multiplied by mscale(factor, mscale_all_dim)². The
// tables are computed in double and each cos/sin rounded once to float, so a position far into a
// long context loses nothing to accumulated error; rotating a row depends only on its position,
// so prefill, decode and any split rotate it identically. K3 and Kimi-Linear (NoPE) never build
// one.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace deltafin {

class Rope {
 public:
  Rope(const RopeConfig& r, int64_t rope_dim);
  // Rotates one rope_dim-wide slice in place for `position`.
  void rotate(float* x, int64_t position) const;
  // The rotation of `position` as [cos_0, sin_0, cos_1, sin_1, ...] (rope_dim doubles, the mscale
  // ratio applied), and applying it to a slice: what rotating many heads at one position shares.
  void angles(int64_t position, double* cos_sin) const;
  static void apply(const double* cos_sin, int64_t rope_dim, float* x);
  // The factor on the softmax scale (qk_dim^-½ · this): mscale(factor, mscale_all_dim)², 1 without
  // YaRN or without mscale_all_dim.
  double score_factor() const { return score_factor_; }
  const std::vector<double>& inv_freq() const { return inv_freq_; }

 private:
  std::vector<double> inv_freq_;
  double cos_scale_ = 1.0;
  double score_factor_ = 1.0;
};

// The softmax scale of the config's MLA: 1/sqrt(nope + rope) (in float, as K3 computes it), times
// the YaRN factor where the config rotates.
float mla_softmax_scale(const MlaConfig& m);

}  // namespace deltafin
