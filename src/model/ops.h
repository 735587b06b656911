// Small element-wise operations of the layers, in fp32 (statistics of norms in double).
#pragma once

#include <cmath>
#include <cstdint>

namespace deltafin::ops {

inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
inline float silu(float x) {
  return x * sigmoid(x);
}

// SiTU(g, u) = [beta * tanh(g / beta) * sigmoid(g)] * [lbeta * tanh(u / lbeta)]  (docs/MODEL.md
// §3.7)
inline float situ(float g, float u, float beta, float lbeta) {
  return beta * std::tanh(g / beta) * sigmoid(g) * (lbeta * std::tanh(u / lbeta));
}

// 1 / sqrt(mean(x^2) + eps)
inline float inv_rms(const float* x, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
}

// out = w ⊙ x / sqrt(mean(x^2) + eps); out may alias x.
inline void rmsnorm(const float* x, const float* w, float eps, int64_t n, float* out) {
  const float r = inv_rms(x, n, eps);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * r);
}

// out[i] = situ(g[i], u[i]) with the same operations in the same order, its tanh and exp taken
// from the active kernel table (SLEEF's vector functions on x86: libm's scalar tanhf and expm1f
// were ~7% of a prefill); out may alias g or u. Element-wise: a value's result depends on the
// value only, whatever n, the thread split or the batch (ops.cpp).
void situ_rows(const float* g, const float* u, int64_t n, float beta, float lbeta, float* out);

// out[i] = silu(g[i]) · u[i] (the SiLU-gated MLP of Kimi-Linear and DeepSeek-V3/K2), exp from
// the active kernel table; element-wise like situ_rows; out may alias g or u.
void silu_rows(const float* g, const float* u, int64_t n, float* out);

// softplus(x) = ln(1 + eˣ), the identity above 20 as FLA's and vLLM's gate kernels (the two
// differ by < 2.1e-9 there), computed without overflow for large x.
inline float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

}  // namespace deltafin::ops
