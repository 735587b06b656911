#include "model/attn_residual.h"

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "model/ops.h"

namespace deltafin {

AttnResidual::AttnResidual(int64_t rows, int64_t hidden, float eps, ThreadPool& pool)
    : R_(rows), H_(hidden), eps_(eps), pool_(pool), partial_(static_cast<size_t>(rows * hidden)) {}

void AttnResidual::mix(const std::vector<float>& score, int64_t first, int64_t n_rows,
                       float* out) const {
  std::vector<const float*> cands;
  for (const auto& an : anchors_) cands.push_back(an.data());
  if (!empty_) cands.push_back(partial_.data());
  const size_t n = cands.size();
  const int64_t H = H_;
  if (n == 1) {
    std::copy_n(cands[0] + first * H, n_rows * H, out);
    return;
  }
  pool_.parallel_for(n_rows, 1, [&](int64_t b, int64_t e, int) {
    std::vector<float> s(n);
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = first + i;
      float mx = -INFINITY;
      for (size_t j = 0; j < n; ++j) {
        const float* cr = cands[j] + r * H;
        double d = 0.0;
        for (int64_t x = 0; x < H; ++x)
          d += static_cast<double>(cr[x]) * score[static_cast<size_t>(x)];
        s[j] = static_cast<float>(d) * ops::inv_rms(cr, H, eps_);  // the keys' RMSNorm, 1e-5
        mx = std::max(mx, s[j]);
      }
      double sum = 0.0;
      for (size_t j = 0; j < n; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      float* o = out + i * H;
      std::fill(o, o + H, 0.0f);
      for (size_t j = 0; j < n; ++j) {
        kernels::active().axpy(static_cast<float>(s[j] / sum), cands[j] + r * H, o, H);
      }
    }
  });
}

void AttnResidual::bank() {
  anchors_.push_back(std::move(partial_));
  partial_.assign(static_cast<size_t>(R_ * H_), 0.0f);
  empty_ = true;
}

void AttnResidual::add(int64_t first, int64_t n, const float* y) {
  float* p = partial_.data() + first * H_;
  if (empty_) {
    std::copy_n(y, n * H_, p);
    return;
  }
  for (int64_t j = 0; j < n * H_; ++j) p[j] += y[j];
}

}  // namespace deltafin
