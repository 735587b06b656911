// The residual stream of the decoder loop, one component per ResidualForm (config.h): what the
// loop in model.cpp calls for every sub-layer — the rows a sub-layer reads (`mix`), banking an
// anchor, adding a sub-layer's output — whatever the family's stream is. K3's Attention Residuals
// (attn_residual.h) mix the banked anchors and the running partial sum; the plain pre-norm stream
// (Kimi-Linear, DeepSeek-V3/K2) is h itself: its mix is h, it never banks, and adding is
// h += y. Nothing here crosses rows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/config.h"

namespace deltafin {

class ThreadPool;

class ResidualStream {
 public:
  virtual ~ResidualStream() = default;
  // The stream's running rows [rows][hidden] (the embedding lands here; a drafter taps them).
  virtual float* partial() = 0;
  // The input of the next sub-layer (before its norm) for rows [first, first + n) into
  // out[n][hidden]; `score` is the sub-layer's mixing vector (AttnRes only).
  virtual void mix(const std::vector<float>& score, int64_t first, int64_t n_rows,
                   float* out) const = 0;
  // Banks the incoming partial as an anchor (AttnRes only; the loop banks where the plan says).
  virtual void bank() = 0;
  // Adds a sub-layer's output rows [first, first + n); end_add() closes the sub-layer.
  virtual void add(int64_t first, int64_t n, const float* y) = 0;
  virtual void end_add() = 0;
};

// h += f(RMSNorm(h)): the pre-norm stream.
class PreNormResidual : public ResidualStream {
 public:
  PreNormResidual(int64_t rows, int64_t hidden);
  float* partial() override { return h_.data(); }
  void mix(const std::vector<float>& score, int64_t first, int64_t n_rows,
           float* out) const override;
  void bank() override;
  void add(int64_t first, int64_t n, const float* y) override;
  void end_add() override {}

 private:
  int64_t H_;
  std::vector<float> h_;
};

// The config's stream over `rows` rows.
std::unique_ptr<ResidualStream> make_residual(const ModelConfig& c, int64_t rows, ThreadPool& pool);

}  // namespace deltafin
