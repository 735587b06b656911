// Replays the fuzz corpora kept in tests/data/fuzz/TARGET (the seeds, and every input a fuzzer
// ever crashed on, named crash-*) through the same bodies the libFuzzer programs run
// (fuzz/fuzz_targets.h), so each finding stays fixed in every build, with or without
// sanitizers and without clang. A body aborts on a finding, which fails this test loudly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_targets.h"
#include "test_util.h"

namespace deltafin {
namespace {

namespace fs = std::filesystem;

class FuzzRegression : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzRegression, EveryKeptInputPasses) {
  // Files the bodies write go to this test's own folder.
  ::setenv("DELTAFIN_FUZZ_TMP", test::temp_dir("fuzz-" + GetParam()).c_str(), 1);
  const fuzz::Target* t = fuzz::find_target(GetParam());
  ASSERT_NE(t, nullptr);
  const fs::path dir = fs::path(test::data_dir()) / "fuzz" / GetParam();
  ASSERT_TRUE(fs::is_directory(dir)) << dir << " holds the corpus of " << GetParam();
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty()) << dir << " is empty";
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    t->body(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
}

std::vector<std::string> target_names() {
  size_t n = 0;
  const fuzz::Target* ts = fuzz::targets(&n);
  std::vector<std::string> names;
  for (size_t i = 0; i < n; ++i) names.push_back(ts[i].name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzRegression, ::testing::ValuesIn(target_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace deltafin
