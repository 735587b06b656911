#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <utility>
#include <vector>

#include "core/test_hooks.h"
#include "core/thread_pool.h"
#include "tensor/dtype.h"
#include "test_util.h"

namespace deltafin {

TEST(ThreadPool, RunsEveryTaskOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  for (int rep = 0; rep < 50; ++rep) {
    pool.run(1000, [&](int t, int) { hits[t].fetch_add(1); });
  }
  for (auto& h : hits) EXPECT_EQ(h.load(), 50);
}

TEST(ThreadPool, ParallelForCoversRangeWithAlignedChunks) {
  ThreadPool pool(2);
  std::vector<int> seen(1003, 0);
  pool.parallel_for(
      1003, 10,
      [&](int64_t b, int64_t e, int) {
        EXPECT_EQ(b % 16, 0);
        for (int64_t i = b; i < e; ++i) seen[i]++;
      },
      16);
  for (int v : seen) EXPECT_EQ(v, 1);
}

TEST(ThreadPool, NestedRunIsSerial) {
  ThreadPool pool(2);
  std::atomic<int> count{0};
  pool.run(4, [&](int, int) { pool.run(3, [&](int, int) { count++; }); });
  EXPECT_EQ(count.load(), 12);
}

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.5f)), -3.5f);
  // 1 + 2^-8 is exactly half-way between bf16 neighbours 1 and 1+2^-7: ties to even -> 1.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(0.333251953125f)), 0.333251953125f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(65504.0f)), 65504.0f);
}

TEST(Binary, VersionFlagWorks) {
  auto r = test::run_deltafin({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find(DELTAFIN_VERSION), std::string::npos);
}

// The step-delay test hook (core/test_hooks.h): a number of ms, capped at a minute; anything
// else is refused (with a warning) rather than read as some other delay.
TEST(TestHooks, StepDelayIsAClampedNumberOrNothing) {
  const char* var = "DELTAFIN_DEBUG_STEP_DELAY_MS";
  ::unsetenv(var);
  EXPECT_EQ(debug_step_delay_ms(), 0);
  for (const auto& [value, ms] : std::vector<std::pair<const char*, int>>{
           {"250", 250}, {"0", 0}, {"999999", 60000}, {"-5", 0}, {"5s", 0}, {"", 0}}) {
    ::setenv(var, value, 1);
    EXPECT_EQ(debug_step_delay_ms(), ms) << value;
  }
  ::unsetenv(var);
}

}  // namespace deltafin
