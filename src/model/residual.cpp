// The pre-norm residual stream and the choice between it and Attention Residuals (residual.h).
#include "model/residual.h"

#include <algorithm>

#include "core/error.h"
#include "model/attn_residual.h"

namespace deltafin {

PreNormResidual::PreNormResidual(int64_t rows, int64_t hidden)
    : H_(hidden), h_(static_cast<size_t>(rows * hidden)) {}

void PreNormResidual::mix(const std::vector<float>& score, int64_t first, int64_t n_rows,
                          float* out) const {
  (void)score;
  std::copy_n(h_.data() + first * H_, n_rows * H_, out);
}

void PreNormResidual::bank() {
  fail("internal: the pre-norm residual stream has no anchors to bank");
}

void PreNormResidual::add(int64_t first, int64_t n, const float* y) {
  float* p = h_.data() + first * H_;
  for (int64_t j = 0; j < n * H_; ++j) p[j] += y[j];
}

std::unique_ptr<ResidualStream> make_residual(const ModelConfig& c, int64_t rows,
                                              ThreadPool& pool) {
  if (c.residual == ResidualForm::kAttnRes) {
    return std::make_unique<AttnResidual>(rows, c.hidden, c.rms_eps, pool);
  }
  return std::make_unique<PreNormResidual>(rows, c.hidden);
}

}  // namespace deltafin
