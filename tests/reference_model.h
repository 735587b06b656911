// An independent float64 evaluation of the K3 text model, written straight from docs/MODEL.md §3
// for tests: token by token, stepwise KDA, expanded MLA (keys and values materialised per head), no
// batching, no kernels. It shares only config parsing and checkpoint reading with the engine.
// Slow; meant for the small synthetic checkpoints the shape-variation tests make.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "storage/checkpoint.h"

namespace deltafin::test {

class ReferenceModel {
 public:
  struct Options {
    // Reads A_log per key channel, broadcast over heads: the reference system's known
    // misreading, a negative control that proves the golden test catches it. Never right for K3.
    bool a_log_per_channel = false;
  };
  explicit ReferenceModel(const std::string& dir) : ReferenceModel(dir, Options{}) {}
  ReferenceModel(const std::string& dir, Options options);
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

  Options opt_;
  ModelConfig c_;
  std::unique_ptr<Checkpoint> ck_;
  std::map<std::string, Mat> mats_;
  std::map<std::string, std::vector<double>> vecs_;
};

}  // namespace deltafin::test
