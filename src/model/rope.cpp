// YaRN RoPE tables (see rope.h): docs/FAMILY.md "RoPE: YaRN on interleaved pairs" step by step.
#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace deltafin {

namespace {

// M(f, m) = 1 if f <= 1 else 0.1·m·ln f + 1
double yarn_mscale(double factor, double m) {
  return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

}  // namespace

Rope::Rope(const RopeConfig& r, int64_t rope_dim) {
  const int64_t half = rope_dim / 2;
  const double d = static_cast<double>(rope_dim);
  const bool yarn = r.factor > 1.0;
  double low = 0, high = 0;
  if (yarn) {
    // corr(n) = d · ln(L0 / (2π n)) / (2 ln θ)
    auto corr = [&](double rotations) {
      return d * std::log(r.original_max_positions / (rotations * 2.0 * M_PI)) /
             (2.0 * std::log(r.theta));
    };
    low = std::max(std::floor(corr(r.beta_fast)), 0.0);
    high = std::min(std::ceil(corr(r.beta_slow)), d - 1.0);
    if (low == high) high += 0.001;
  }
  for (int64_t i = 0; i < half; ++i) {
    const double base = 1.0 / std::pow(r.theta, static_cast<double>(2 * i) / d);
    if (!yarn) {
      inv_freq_.push_back(base);
      continue;
    }
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    inv_freq_.push_back(base / r.factor * ramp + base * (1.0 - ramp));
  }
  if (yarn) {
    cos_scale_ = yarn_mscale(r.factor, r.mscale) / yarn_mscale(r.factor, r.mscale_all_dim);
    const double m = yarn_mscale(r.factor, r.mscale_all_dim);
    score_factor_ = m * m;
  }
}

void Rope::angles(int64_t position, double* cos_sin) const {
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const double a = static_cast<double>(position) * inv_freq_[i];
    cos_sin[2 * i] = std::cos(a) * cos_scale_;
    cos_sin[2 * i + 1] = std::sin(a) * cos_scale_;
  }
}

// x'[2i] = a cos − b sin, x'[2i+1] = a sin + b cos, in double, each rounded once.
void Rope::apply(const double* cs, int64_t rope_dim, float* x) {
  for (int64_t i = 0; i < rope_dim / 2; ++i) {
    const double c = cs[2 * i], s = cs[2 * i + 1];
    const double x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = static_cast<float>(x0 * c - x1 * s);
    x[2 * i + 1] = static_cast<float>(x0 * s + x1 * c);
  }
}

void Rope::rotate(float* x, int64_t position) const {
  std::vector<double> cs(2 * inv_freq_.size());
  angles(position, cs.data());
  apply(cs.data(), static_cast<int64_t>(cs.size()), x);
}

float mla_softmax_scale(const MlaConfig& m) {
  const float plain = 1.0f / std::sqrt(static_cast<float>(m.qk_nope_dim + m.qk_rope_dim));
  if (!m.rope.enabled) return plain;
  const Rope rope(m.rope, m.qk_rope_dim);
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(m.qk_nope_dim + m.qk_rope_dim)) *
                            rope.score_factor());
}

}  // namespace deltafin
