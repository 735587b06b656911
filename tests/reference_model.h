// An independent float64 evaluation of the K3 text model, written straight from K3-SPEC §3 for
// tests: token by token, stepwise KDA, expanded MLA (keys and values materialised per head), no
// batching, no kernels. It shares only config parsing and checkpoint reading with the engine.
// Slow; meant for the small synthetic checkpoints the shape-variation tests make.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/config.h"

namespace deltafin::test {

class ReferenceModel {
 public:
  explicit ReferenceModel(const std::string& dir);
  // Logits [T][vocab] for the sequence, row t after tokens[0..t].
  std::vector<double> logits(const std::vector<int32_t>& tokens);

 private:
  struct Mat {
    int64_t rows = 0, cols = 0;
    std::vector<double> w;
  };
  const Mat& mat(const std::string& name);
  const std::vector<double>& vec(const std::string& name);
  std::vector<double> mv(const std::string& name, const std::vector<double>& x);

  ModelConfig c_;
  std::unique_ptr<Checkpoint> ck_;
  std::map<std::string, Mat> mats_;
  std::map<std::string, std::vector<double>> vecs_;
};

}  // namespace deltafin::test
