// The golden tiny checkpoints (tests/data/k3-tiny-*, copied from the reference set): logits from
// a float64 evaluation of the K3 semantics; tests/data/kimi-linear-tiny: Kimi-Linear's tiny
// release-layout checkpoint (tools/family/make_tiny_kimi_linear.py) with its case from the float64
// reference (tools/family/kimi_linear_ref.py case; decays that underflow float32, docs/FAMILY.md
// KL.11); tests/data/k2-tiny, k2-int4-tiny, k25-tiny, deepseek-v3-tiny: the DeepSeek-V3
// architecture in Kimi K2's FP8, K2-Thinking's INT4, K2.5's nested and DeepSeek-V3's FP8 +
// grouped-router layouts (tools/family/make_tiny_deepseek_v3.py --small, deepseek_v3_ref.py case:
// exact dequantisation, YaRN RoPE). The engine must match within 2e-3 with identical
// argmax at every position, in prefill, decode and split modes through the real binary, and
// reproduce the greedy continuation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "gpu/gpu.h"
#include "model/model.h"
#include "test_util.h"

namespace deltafin {
namespace {

struct GoldenCase {
  std::string dir;
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  int64_t T = 0, V = 0;
  std::vector<int32_t> greedy_prompt, greedy_continuation;
};

GoldenCase load_case(const std::string& name) {
  GoldenCase g;
  g.dir = test::data_dir() + "/" + name;
  auto j = nlohmann::json::parse(test::slurp(g.dir + "/case.json"));
  g.tokens = j["tokens"].get<std::vector<int32_t>>();
  g.T = j["logits_shape"][0];
  g.V = j["logits_shape"][1];
  std::string raw = test::slurp(g.dir + "/" + j["logits_file"].get<std::string>());
  g.logits.resize(raw.size() / 4);
  std::memcpy(g.logits.data(), raw.data(), raw.size());
  g.greedy_prompt = j["greedy_prompt"].get<std::vector<int32_t>>();
  g.greedy_continuation = j["greedy_continuation"].get<std::vector<int32_t>>();
  return g;
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

// Max |diff| and the number of positions whose argmax differs.
std::pair<double, int> compare(const GoldenCase& g, const std::vector<float>& got) {
  double mx = 0;
  int bad_argmax = 0;
  for (int64_t t = 0; t < g.T; ++t) {
    const float* e = g.logits.data() + t * g.V;
    const float* o = got.data() + t * g.V;
    for (int64_t i = 0; i < g.V; ++i)
      mx = std::max(mx, static_cast<double>(std::fabs(e[i] - o[i])));
    if (std::max_element(e, e + g.V) - e != std::max_element(o, o + g.V) - o) ++bad_argmax;
  }
  return {mx, bad_argmax};
}

// "k3-tiny-mxfp4_split_7": a (model, mode) case as a test name.
std::string case_name(const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& info) {
  std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param);
  std::replace_if(
      s.begin(), s.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
  return s;
}

class Golden : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Golden, LogitsThroughBinaryMatchReference) {
  const auto& [name, mode] = GetParam();
  GoldenCase g = load_case(name);
  std::string out = test::temp_dir("golden") + "/logits.f32";
  auto r = test::run_deltafin({"logits", "--model", g.dir + "/model", "--tokens", join(g.tokens),
                               "--mode", mode, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string raw = test::slurp(out);
  ASSERT_EQ(raw.size(), static_cast<size_t>(g.T * g.V * 4));
  std::vector<float> got(raw.size() / 4);
  std::memcpy(got.data(), raw.data(), raw.size());
  auto [mx, bad] = compare(g, got);
  EXPECT_LE(mx, 2e-3) << name << " " << mode;
  EXPECT_EQ(bad, 0) << name << " " << mode;
}

INSTANTIATE_TEST_SUITE_P(
    AllModes, Golden,
    ::testing::Combine(::testing::Values("k3-tiny-mxfp4", "k3-tiny-bf16", "kimi-linear-tiny",
                                         "k2-tiny", "k2-int4-tiny", "k25-tiny", "deepseek-v3-tiny"),
                       ::testing::Values("prefill", "decode", "split:1", "split:7", "split:19")),
    case_name);

// The same through the Vulkan backend (--gpu 0: lavapipe where there is no GPU): the trunk
// resident on the device and, in passes of at least --gpu-min-rows rows, the routed experts as
// grouped products (each uploaded once per pass). fp32 summation order differs from the CPU's,
// nothing else. Few cases: lavapipe is slow.
struct GpuCase {
  const char* model;
  const char* mode;
  const char* min_rows;
};
void PrintTo(const GpuCase& k, std::ostream* os) {
  *os << k.model << " " << k.mode << " --gpu-min-rows " << k.min_rows;
}
class GoldenGpu : public ::testing::TestWithParam<GpuCase> {};

TEST_P(GoldenGpu, LogitsAndGreedyTokensMatchTheCpu) {
  if (!gpu::compiled_in()) GTEST_SKIP() << "built without the Vulkan backend";
  if (gpu::Probe p = gpu::probe(); p.devices.empty())
    GTEST_SKIP() << "no Vulkan device: " << p.error;
  const GpuCase k = GetParam();
  GoldenCase g = load_case(k.model);
  const std::string out = test::temp_dir("golden_gpu") + "/logits.f32";
  auto r = test::run_deltafin({"logits", "--model", g.dir + "/model", "--tokens", join(g.tokens),
                               "--mode", k.mode, "--out", out, "--gpu", "0", "--gpu-min-rows",
                               k.min_rows});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("[gpu] using Vulkan device 0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[gpu] plan: 10 of 10 trunk units resident"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("device error"), std::string::npos) << r.err;
  std::string raw = test::slurp(out);
  ASSERT_EQ(raw.size(), static_cast<size_t>(g.T * g.V * 4));
  std::vector<float> got(raw.size() / 4);
  std::memcpy(got.data(), raw.data(), raw.size());
  auto [mx, bad] = compare(g, got);
  EXPECT_LE(mx, 2e-3);
  EXPECT_EQ(bad, 0);
  if (std::string(k.mode) != "prefill") return;
  r = test::run_deltafin({"run", "--json", "--model", g.dir + "/model", "--prompt-ids",
                          join(g.greedy_prompt), "--max-new",
                          std::to_string(g.greedy_continuation.size()), "--gpu", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["completion_ids"].get<std::vector<int32_t>>(),
            g.greedy_continuation);
}

INSTANTIATE_TEST_SUITE_P(Vulkan, GoldenGpu,
                         ::testing::Values(GpuCase{"k3-tiny-mxfp4", "prefill", "1"},
                                           GpuCase{"k3-tiny-bf16", "prefill", "1"},
                                           GpuCase{"k3-tiny-mxfp4", "split:17", "16"},
                                           GpuCase{"k3-tiny-bf16", "split:17", "16"}),
                         [](const auto& info) {
                           return std::string(info.param.model[8] == 'm' ? "mxfp4_" : "bf16_") +
                                  (info.param.mode[0] == 'p' ? "prefill" : "split17");
                         });

class GoldenGreedy : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenGreedy, ContinuationReproduced) {
  GoldenCase g = load_case(GetParam());
  auto model = open_model(g.dir + "/model");
  State st = model->new_state();
  auto logits = model->forward(st, g.greedy_prompt);
  std::vector<int32_t> got;
  for (size_t i = 0; i < g.greedy_continuation.size(); ++i) {
    int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    got.push_back(next);
    logits = model->forward(st, std::span<const int32_t>(&next, 1));
  }
  EXPECT_EQ(got, g.greedy_continuation);
}

INSTANTIATE_TEST_SUITE_P(Both, GoldenGreedy,
                         ::testing::Values("k3-tiny-mxfp4", "k3-tiny-bf16", "kimi-linear-tiny",
                                           "k2-tiny", "k2-int4-tiny", "k25-tiny",
                                           "deepseek-v3-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace deltafin
