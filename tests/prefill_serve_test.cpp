// Prompts at the bound in the server (issue 15): with --prefill-chunk auto one forward pass holds
// the rows the memory plan sized, decoding sequences take theirs first and a prompt fills the
// rest; the remainder of the prompt follows in the next pass. Checked through the real binary:
// the pass never exceeds the planned rows even when decoders and a prompt as long as a pass meet,
// and the output is the same as a server feeding the prompt 64 rows at a time.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "server_util.h"
#include "test_util.h"

namespace deltafin::test {
namespace {

using namespace std::chrono_literals;

double metric(ServerProcess& srv, const std::string& name) {
  auto c = srv.client();
  const std::string m = get(*c, "/metrics").body;
  const size_t p = m.find("\n" + name + " ");
  return p == std::string::npos ? -1.0 : std::stod(m.substr(p + name.size() + 2));
}

// `n` token ids (comma-separated) below the tiny model's 512-id tokenizer.
std::string prompt_ids(int n, int seed) {
  std::string s;
  uint32_t x = static_cast<uint32_t>(seed) * 2654435761u + 12345u;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    if (i > 0) s += ',';
    s += std::to_string(10 + (x >> 8) % 480);
  }
  return s;
}

TEST(PrefillServe, AutoPassesHoldThePlannedRowsDecodersFirst) {
  const int64_t ctx = 256;
  // Every step slowed, so the three decoders are still decoding when the long prompt arrives.
  setenv("DELTAFIN_DEBUG_STEP_DELAY_MS", "20", 1);
  ServerProcess srv(
      {"--parallel", "4", "--ctx", std::to_string(ctx), "--state-cache", "none", "-v"});
  unsetenv("DELTAFIN_DEBUG_STEP_DELAY_MS");
  ASSERT_TRUE(srv.ready()) << srv.err();
  EXPECT_NE(srv.err().find("[plan] prefill passes of up to"), std::string::npos) << srv.err();
  const double limit = metric(srv, "deltafin_forward_rows_limit");
  ASSERT_GE(limit, 8) << "auto: the plan's pass rows";
  ASSERT_LE(limit, static_cast<double>(ctx));
  const int long_len = static_cast<int>(limit) - 1;  // a prompt that fills a pass by itself

  std::vector<std::string> decoders = {prompt_ids(5, 1), prompt_ids(6, 2), prompt_ids(7, 3)};
  std::vector<nlohmann::json> decoded;
  std::thread background([&] { decoded = concurrent_completions(srv, decoders, 60); });
  for (int i = 0; i < 400 && metric(srv, "deltafin_generated_tokens_total") < 6; ++i)
    std::this_thread::sleep_for(10ms);
  const double active = metric(srv, "deltafin_active_sequences");
  const std::string long_prompt = prompt_ids(long_len, 4);
  const auto shared = concurrent_completions(srv, {long_prompt}, 1);
  background.join();
  ASSERT_EQ(active, 3) << "the decoders were running when the prompt came: " << decoded[0].dump();
  ASSERT_TRUE(shared[0].contains("choices")) << shared[0].dump();
  EXPECT_EQ(shared[0]["usage"]["prompt_tokens"], long_len);
  // Without the budget this pass would have carried 3 decoding rows + the whole prompt.
  EXPECT_LE(metric(srv, "deltafin_forward_rows_max"), limit);
  EXPECT_EQ(srv.stop(), 0);

  // The same completions from a server that feeds every prompt 64 rows at a time.
  ServerProcess ref(
      {"--prefill-chunk", "64", "--ctx", std::to_string(ctx), "--state-cache", "none"});
  ASSERT_TRUE(ref.ready()) << ref.err();
  EXPECT_EQ(metric(ref, "deltafin_forward_rows_limit"), 0);
  const auto alone = concurrent_completions(ref, {long_prompt}, 1);
  EXPECT_EQ(alone[0]["choices"][0]["text"], shared[0]["choices"][0]["text"]);
  for (size_t i = 0; i < decoders.size(); ++i) {
    const auto one = concurrent_completions(ref, {decoders[i]}, 60);
    EXPECT_EQ(one[0]["choices"][0]["text"], decoded[i]["choices"][0]["text"]) << i;
  }
  EXPECT_LE(metric(ref, "deltafin_forward_rows_max"), 64);
  EXPECT_EQ(ref.stop(), 0);
}

}  // namespace
}  // namespace deltafin::test
