// Helpers shared by the tests: paths to test data and the binary, temporary folders, and running
// the real `deltafin` program with captured output.
#pragma once

#include <string>
#include <vector>

namespace deltafin::test {

inline std::string data_dir() { return DELTAFIN_TEST_DATA; }
inline std::string binary() { return DELTAFIN_BINARY; }

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

std::string slurp(const std::string& path);
void spit(const std::string& path, const std::string& data);

}  // namespace deltafin::test
