// Helpers shared by the tests: paths to test data and the binary, temporary folders, and running
// the real `deltafin` program with captured output.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "fixtures/synthetic.h"

namespace deltafin::test {

inline std::string data_dir() {
  return DELTAFIN_TEST_DATA;
}
inline std::string binary() {
  return DELTAFIN_BINARY;
}

// Engine options for a model folder in a test: every setting at its default, no heat file,
// nothing printed (open_model's own default for a bare folder).
inline EngineOptions engine_options(const std::string& dir) {
  EngineOptions o;
  o.model = dir;
  o.heat_file = "";
  o.plan_on_terminal = false;
  return o;
}

// A fresh, empty folder under the build tree, unique per call; removed at process exit.
std::string temp_dir(const std::string& name);

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs the deltafin binary with `args` (no shell), feeding `stdin_data`; captures stdout/stderr.
RunResult run_deltafin(const std::vector<std::string>& args, const std::string& stdin_data = "",
                       double timeout_s = 300);

// A deltafin process running in the background (for signals and servers).
class Child {
 public:
  // With `with_stdin`, the child's stdin is a pipe this object writes to (else /dev/null).
  explicit Child(const std::vector<std::string>& args, bool with_stdin = false);
  void write_stdin(const std::string& data);
  ~Child();
  // Reads stdout until it holds `needle` (or `timeout_s` passes); returns what was read so far.
  std::string wait_stdout(const std::string& needle, double timeout_s = 60);
  // Reads stderr until `needle` appears at or after byte `from` (what was printed before a step
  // does not answer for the step); returns all of stderr so far.
  std::string wait_stderr(const std::string& needle, double timeout_s = 60, size_t from = 0);
  size_t stderr_size() const { return r_.err.size(); }
  void signal(int sig);
  // Waits for exit (killing it after `timeout_s`) and returns everything it printed.
  RunResult wait(double timeout_s = 60);
  int pid() const { return pid_; }

 private:
  void pump(double timeout_s, const std::function<bool()>& done);
  int pid_ = -1, out_ = -1, err_ = -1, in_ = -1;
  RunResult r_;
  bool exited_ = false;
};

std::string slurp(const std::string& path);

// The built-in demo model, installed into a fresh cache once per process: its folder.
const std::string& demo_model_dir();

// The folder of a `make-model FOLDER args...` checkpoint shared by every test process of this
// build. ctest runs each test in a process of its own, so a per-process cache made the same model
// once per test (a K2-width model: 8 s of CPU, 21 s under ASan). It is made once, into a private
// folder renamed into place (a process that loses the race removes its own copy), under a name
// that holds the arguments and the binary's modification time, so a rebuilt make-model never
// serves an older model. Read-only to its users: a test that changes files makes its own.
std::string shared_model(const std::vector<std::string>& make_model_args);

// `make-model --preset k3` shrunk so a test takes seconds: K3's layer kinds and MLA/MoE
// structure with 4 layers, 16 experts (top 4) and hidden 256.
SyntheticSpec small_k3_spec();
void spit(const std::string& path, const std::string& data);

// Pearson's chi-square of `observed` counts (n draws) against `expected` probabilities, and its
// 0.1% critical value (Wilson-Hilferty). Cells expected under 5 draws are pooled, with every
// draw of an outcome `expected` does not list (which the exact distribution gives probability
// 0, so any such draw makes the statistic huge).
template <typename Key, typename Count>
std::pair<double, double> chi_square(const std::map<Key, double>& expected,
                                     const std::map<Key, Count>& observed, int64_t n) {
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int cells = 0;
  double seen = 0;
  for (const auto& [k, p] : expected) {
    const double e = p * static_cast<double>(n);
    const auto it = observed.find(k);
    const double o = it == observed.end() ? 0 : static_cast<double>(it->second);
    seen += o;
    if (e < 5) {
      pooled_e += e;
      pooled_o += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++cells;
  }
  pooled_o += static_cast<double>(n) - seen;
  if (pooled_e > 0 || pooled_o > 0) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1e-9);
    ++cells;
  }
  const double df = std::max(1, cells - 1);
  const double z = 3.09;  // the upper 0.1% quantile of the normal
  const double a = 2.0 / (9.0 * df);
  return {stat, df * std::pow(1 - a + z * std::sqrt(a), 3)};
}

}  // namespace deltafin::test
