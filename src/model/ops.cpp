// The element-wise activations over rows, their exp and tanh from the active kernel table.
#include "model/ops.h"

#include <algorithm>

#include "kernels/kernels.h"

namespace deltafin::ops {

void situ_rows(const float* g, const float* u, int64_t n, float beta, float lbeta, float* out) {
  const kernels::KernelTable& k = kernels::active();
  constexpr int64_t kBlock = 256;  // three blocks of arguments stay in L1
  float tg[kBlock], eg[kBlock], tu[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    for (int64_t i = 0; i < m; ++i) {
      tg[i] = g[b + i] / beta;
      eg[i] = -g[b + i];
      tu[i] = u[b + i] / lbeta;
    }
    k.tanh(tg, tg, m);
    k.exp(eg, eg, m);
    k.tanh(tu, tu, m);
    // situ(): beta * tanh(g / beta) * sigmoid(g) * (lbeta * tanh(u / lbeta)), sigmoid(g) being
    // 1 / (1 + exp(-g)); evaluated left to right as there.
    for (int64_t i = 0; i < m; ++i) {
      out[b + i] = beta * tg[i] * (1.0f / (1.0f + eg[i])) * (lbeta * tu[i]);
    }
  }
}

void silu_rows(const float* g, const float* u, int64_t n, float* out) {
  const kernels::KernelTable& k = kernels::active();
  constexpr int64_t kBlock = 256;
  float eg[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    for (int64_t i = 0; i < m; ++i) eg[i] = -g[b + i];
    k.exp(eg, eg, m);
    // silu(g) * u = g * sigmoid(g) * u, sigmoid(g) being 1 / (1 + exp(-g)).
    for (int64_t i = 0; i < m; ++i) out[b + i] = g[b + i] * (1.0f / (1.0f + eg[i])) * u[b + i];
  }
}

}  // namespace deltafin::ops
