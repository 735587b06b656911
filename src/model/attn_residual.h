// The residual stream of the decoder loop with Attention Residuals (docs/MODEL.md §3.3), over the
// rows of a pass: the banked anchors and the running partial sum p, which is "empty" right after
// a bank until the next sub-layer output lands in it. Nothing here crosses rows.
#pragma once

#include <cstdint>
#include <vector>

#include "model/residual.h"

namespace deltafin {

class ThreadPool;

class AttnResidual : public ResidualStream {
 public:
  AttnResidual(int64_t rows, int64_t hidden, float eps, ThreadPool& pool);

  float* partial() override { return partial_.data(); }
  const float* partial() const { return partial_.data(); }

  // MIX(anchors ++ [p]) for rows [first, first + n) into out[n][hidden]: softmax over candidates
  // of (score · c_j / rms(c_j)), applied to the raw candidates. A partial that is empty (just
  // banked, nothing added yet) is no candidate: it is the last anchor now, so mixing right after
  // a bank is the spec's mix right before it. A single candidate is the value itself (the spec's
  // "nothing to mix with" before the first bank; a softmax over one is 1 exactly anyway).
  void mix(const std::vector<float>& score, int64_t first, int64_t n_rows,
           float* out) const override;

  // Banks the raw incoming partial as an anchor and resets the partial to empty.
  void bank() override;

  // p = (p empty) ? y : p + y for rows [first, first + n); end_add() closes the sub-layer once
  // all its rows have landed.
  void add(int64_t first, int64_t n, const float* y) override;
  void end_add() override { empty_ = false; }

 private:
  int64_t R_, H_;
  float eps_;
  ThreadPool& pool_;
  std::vector<std::vector<float>> anchors_;
  std::vector<float> partial_;
  bool empty_ = false;
};

}  // namespace deltafin
