// The overlaps of the out-of-core regimes (issue 37 items 2 and 3), through the library and the
// real binary:
//  * the shared experts are computed while the routed experts' reads are in flight (inside the
//    routed-experts step, before its first expert is applied) and the logits are bit for bit those
//    of computing them after the routed experts (a provider that never reports its reads issued
//    gets the old order) — for the latent MoE (K3) and the plain one (Kimi-Linear, DeepSeek-V3);
//  * the trunk's read-ahead is as deep as the plan says: the planner never lets it exceed the
//    budget, the automatic depth never costs a resident unit, and with --trunk-read-ahead 3 a run
//    keeps three units read ahead of the one computing (bench's accounting and the trace's
//    counter say so), with the mapped run's logits and peak RSS within the budget.
// Checked on structure and counts, never on timings: no assertion depends on the machine's speed.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "fixtures/synthetic.h"
#include "model/config.h"
#include "storage/checkpoint.h"
#include "storage/expert_directory.h"
#include "storage/plan.h"
#include "storage/reader_pool.h"
#include "streaming_util.h"
#include "test_util.h"

namespace deltafin {
namespace {

using nlohmann::json;

// Carries out each step like the mapped provider but never calls `issued`: the model then
// computes the shared experts after the routed ones, as it did before they overlapped the reads.
class NoIssuedHook : public ExpertProvider {
 public:
  explicit NoIssuedHook(std::unique_ptr<ExpertProvider> inner) : inner_(std::move(inner)) {}
  void run(const ExpertStep& step) override {
    ExpertStep late = step;
    late.issued = nullptr;
    inner_->run(late);
  }
  uint64_t expert_bytes() const override { return inner_->expert_bytes(); }
  std::unique_ptr<ExpertBatch> request(int layer, std::span<const int> experts) override {
    return inner_->request(layer, experts);
  }
  ExpertHandle acquire(int layer, int expert) override { return inner_->acquire(layer, expert); }
  ExpertStats stats() const override { return inner_->stats(); }
  std::string describe() const override { return "no issued hook"; }

 private:
  std::unique_ptr<ExpertProvider> inner_;
};

TEST(StreamOverlap, SharedExpertsDuringTheReadsGiveTheSameFloats) {
  for (const char* name :
       {"k3-tiny-mxfp4", "k3-tiny-bf16", "kimi-linear-tiny", "deepseek-v3-tiny"}) {
    const std::string dir = test::data_dir() + "/" + name + "/model";
    auto early = open_model(dir);
    auto late = open_model(
        test::engine_options(dir), {},
        [&](const ModelConfig& c, const Checkpoint& ck, ExpertFormat f) {
          return std::make_unique<NoIssuedHook>(std::make_unique<MmapExpertProvider>(c, ck, f));
        });
    ASSERT_GT(early->config().moe.num_shared_experts, 0) << name;
    std::vector<int32_t> prompt(24);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 41 + 3) % 250);
    State a = early->new_state(), b = late->new_state();
    EXPECT_EQ(early->forward(a, prompt, true), late->forward(b, prompt, true)) << name;
    for (int32_t t : {9, 201, 31, 77}) {  // every model's vocabulary has 256 ids at least
      const std::vector<int32_t> one = {t};
      EXPECT_EQ(early->forward(a, one), late->forward(b, one)) << name << " token " << t;
    }
  }
}

// Every span of a trace file with its thread's name; counters apart.
struct OverlapSpan {
  std::string thread, name;
  double ts = 0, dur = 0;
  json args;
};
struct OverlapTrace {
  std::vector<OverlapSpan> spans;
  std::vector<std::pair<std::string, json>> counters;  // name, args
};
OverlapTrace read_overlap_trace(const std::string& path) {
  const json t = json::parse(test::slurp(path));
  std::map<int, std::string> names;
  for (const json& e : t["traceEvents"])
    if (e["ph"] == "M") names[e["tid"].get<int>()] = e["args"]["name"];
  OverlapTrace out;
  for (const json& e : t["traceEvents"]) {
    if (e["ph"] == "C") out.counters.emplace_back(e["name"], e["args"]);
    if (e["ph"] != "X") continue;
    out.spans.push_back({names[e["tid"].get<int>()], e["name"], e["ts"].get<double>(),
                         e["dur"].get<double>(), e.value("args", json::object())});
  }
  return out;
}

std::string overlap_kib(uint64_t bytes) {
  return std::to_string((bytes + 1023) / 1024) + "K";
}

// The tiny preset (9 layers, experts and trunk streamed) at the smallest budget its plan takes.
struct OverlapModel {
  std::string dir;
  uint64_t min = 0;
};
const OverlapModel& overlap_model() {
  static const OverlapModel m{test::tiny_stream_model().dir,
                              test::tiny_stream_model().min_working_set};
  return m;
}

// On the main thread, each decode pass's MoE layer computes its shared experts inside its
// routed-experts step and before the step applies its first expert: while the step's reads are
// in flight, not after them.
TEST(StreamOverlap, SharedExpertsRunInsideTheRoutedStepBeforeItsFirstExpert) {
  const std::string path = test::temp_dir("overlaptrace") + "/t.json";
  const auto r = test::run_deltafin(
      {"run", "--json", "--model", overlap_model().dir, "--ctx", "256", "--prompt-ids",
       "5,17,200,3,99,42,7,300", "--max-new", "6", "--prefill-chunk", "16", "--memory-budget",
       overlap_kib(overlap_model().min + (64 << 10)), "--readers", "2", "--trace", path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_GT(json::parse(r.out)["expert_misses"].get<int>(), 0) << "experts should stream";
  const OverlapTrace t = read_overlap_trace(path);
  std::vector<const OverlapSpan*> steps;
  for (const auto& s : t.spans)
    if (s.thread == "main" && s.name == "routed experts") steps.push_back(&s);
  ASSERT_FALSE(steps.empty());
  int checked = 0;
  for (const OverlapSpan* step : steps) {
    const double a = step->ts, b = step->ts + step->dur;
    const OverlapSpan* shared = nullptr;
    double first_expert = b;
    for (const auto& s : t.spans) {
      if (s.thread != "main" || s.ts < a || s.ts + s.dur > b) continue;
      if (s.name == "shared experts") shared = &s;
      if (s.name == "expert") first_expert = std::min(first_expert, s.ts);
    }
    ASSERT_NE(shared, nullptr) << "no shared-experts span inside the step at " << a;
    EXPECT_EQ(shared->args["layer"], step->args["layer"]);
    EXPECT_EQ(shared->args["overlapped"], 1);
    EXPECT_LE(shared->ts + shared->dur, first_expert) << "layer " << step->args["layer"];
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(steps.size()));
}

// The planner: whatever read-ahead is asked for, the plan stays within the budget; the automatic
// depth keeps the resident units a depth of one would (a read-ahead buffer saves no byte), and
// an asked-for depth gets its buffers where the budget holds them.
TEST(StreamOverlap, ReadAheadDepthStaysWithinTheBudget) {
  const ModelConfig c = load_config(overlap_model().dir);
  auto ck = Checkpoint::open(overlap_model().dir);
  const uint64_t min = overlap_model().min;
  bool deeper = false;
  for (uint64_t extra : {0ull, 256ull << 10, 1ull << 20, 3ull << 20, 6ull << 20, 12ull << 20}) {
    for (int ahead : {0, 1, 2, 3, 8}) {
      PlanOptions o;
      o.budget = min + extra;
      o.shape.max_rows = 16;
      o.context = 256;
      o.trunk_read_ahead = ahead;
      const MemoryPlan p = plan_memory(c, *ck, o);
      const uint64_t used =
          p.fixed_bytes() + p.trunk_resident_bytes + p.stream_buffer_bytes + p.expert_cache_bytes;
      EXPECT_LE(used, p.budget) << "extra " << extra << " ahead " << ahead;
      EXPECT_GE(p.expert_cache_bytes, p.expert_slot_bytes * static_cast<uint64_t>(c.moe.top_k));
      const auto streamed = std::count(p.resident.begin(), p.resident.end(), false);
      if (streamed == 0) continue;
      EXPECT_GE(p.stream_buffers, 2);
      EXPECT_LE(p.stream_buffers, std::max<int64_t>(2, streamed));
      if (ahead > 0) {
        EXPECT_LE(p.stream_buffers, std::max(2, ahead + 1));
      }
      if (ahead == 0) {
        o.trunk_read_ahead = 1;
        const MemoryPlan one = plan_memory(c, *ck, o);
        EXPECT_EQ(p.resident, one.resident) << "extra " << extra;
        EXPECT_EQ(one.stream_buffers, 2);
      }
      if (ahead == 3 && p.stream_buffers == 4) deeper = true;
    }
  }
  EXPECT_TRUE(deeper) << "no budget in the sweep held a read-ahead of 3";
}

// A budget that holds four stream buffers beside the minimum working set of passes of
// `max_rows` rows (run and bench pass --prefill-chunk 16 or less; logits plans 256).
uint64_t deep_budget(int64_t max_rows, int* buffers) {
  const ModelConfig c = load_config(overlap_model().dir);
  auto ck = Checkpoint::open(overlap_model().dir);
  PlanOptions o;
  o.budget = 1ull << 40;
  o.shape.max_rows = max_rows;
  o.context = 256;
  o.budget = plan_memory(c, *ck, o).min_working_set;
  const MemoryPlan p = plan_memory(c, *ck, o);
  o.budget += p.stream_buffer_bytes + (64 << 10);  // two more buffers of the largest unit
  o.trunk_read_ahead = 3;
  *buffers = plan_memory(c, *ck, o).stream_buffers;
  return o.budget;
}

// With --trunk-read-ahead 3, bench reports the depth it planned and the run kept three units read
// ahead (the trace's counter agrees); the tokens are the mapped run's and the peak RSS stays within
// the budget plus the stated overhead.
TEST(StreamOverlap, DeeperTrunkReadAheadKeepsSeveralUnitsInFlightExactly) {
  int buffers = 0;
  const uint64_t budget = deep_budget(16, &buffers);
  ASSERT_EQ(buffers, 4);
  const std::string path = test::temp_dir("overlapdeep") + "/b.json";
  const auto r = test::run_deltafin({"bench",
                                     "--json",
                                     "--model",
                                     overlap_model().dir,
                                     "--ctx",
                                     "256",
                                     "--memory-budget",
                                     overlap_kib(budget),
                                     "--trunk-read-ahead",
                                     "3",
                                     "--readers",
                                     "2",
                                     "--prompt-tokens",
                                     "8",
                                     "--gen-tokens",
                                     "4",
                                     "--reps",
                                     "1",
                                     "--no-disk-probe",
                                     "--trace",
                                     path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_GT(j["trunk_bytes_streamed_per_token"].get<double>(), 0) << j.dump();
  EXPECT_EQ(j["trunk_read_ahead_units"], 3) << j.dump();
  EXPECT_EQ(j["trunk_read_ahead_peak"], 3) << j.dump();
  int64_t most = 0;
  for (const auto& [name, args] : read_overlap_trace(path).counters)
    if (name == "trunk read-ahead") most = std::max<int64_t>(most, args["units"].get<int64_t>());
  EXPECT_GE(most, 3);

  // The same depth at the old default: one unit ahead.
  const auto one = test::run_deltafin(
      {"bench", "--json", "--model", overlap_model().dir, "--ctx", "256", "--memory-budget",
       overlap_kib(overlap_model().min + (64 << 10)), "--readers", "2", "--prompt-tokens", "8",
       "--gen-tokens", "4", "--reps", "1", "--no-disk-probe"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_EQ(json::parse(one.out)["trunk_read_ahead_units"], 1);
  EXPECT_EQ(json::parse(one.out)["trunk_read_ahead_peak"], 1);

  // Exact, and within the budget.
  const std::string toks = "5,17,200,3,99,42,7,300,64,128,1,250";
  const auto mapped = test::cli_logits({"--mmap"}, overlap_model().dir, toks, "decode");
  const auto deep = test::cli_logits({"--memory-budget", overlap_kib(deep_budget(256, &buffers)),
                                      "--trunk-read-ahead", "3", "--ctx", "256"},
                                     overlap_model().dir, toks, "decode");
  EXPECT_EQ(mapped, deep);
  EXPECT_EQ(buffers, 4);
  const auto run = test::run_deltafin(
      {"run", "--json", "--model", overlap_model().dir, "--ctx", "256", "--prompt-ids", toks,
       "--max-new", "6", "--memory-budget", overlap_kib(budget), "--trunk-read-ahead", "3"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json rj = json::parse(run.out);
  EXPECT_LE(rj["peak_rss_bytes"].get<double>(), static_cast<double>(budget + kFixedOverheadBytes));
  const auto ref = test::run_deltafin({"run", "--json", "--model", overlap_model().dir,
                                       "--prompt-ids", toks, "--max-new", "6", "--mmap"});
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  EXPECT_EQ(json::parse(ref.out)["completion_ids"], rj["completion_ids"]);
}

// Two pools sharing a gate (the trunk's and the expert store's on the model folder): a
// read-ahead task of one does not start while the other has a demand read queued or running, and
// starts once it ends; background and demand tasks of the gated pool are not held back.
TEST(StreamOverlap, ReadAheadWaitsForTheOtherPoolsDemandReads) {
  auto gate = std::make_shared<ReadGate>();
  ReaderPool trunk(1, gate), experts(1, gate);
  std::promise<void> release_demand;
  std::shared_future<void> demand_may_end = release_demand.get_future().share();
  std::promise<void> demand_started;
  std::atomic<bool> demand_done{false};
  experts.submit(ReaderPool::Priority::kDemand, [&] {
    demand_started.set_value();
    demand_may_end.wait();
    demand_done = true;
  });
  demand_started.get_future().wait();
  EXPECT_TRUE(gate->busy());
  std::promise<bool> ahead_saw;  // whether the demand read had ended when the read-ahead ran
  std::promise<void> background_ran;
  trunk.submit(ReaderPool::Priority::kAhead, [&] { ahead_saw.set_value(demand_done.load()); });
  trunk.submit(ReaderPool::Priority::kBackground, [&] { background_ran.set_value(); });
  // The background task behind the held read-ahead runs while the demand read is still running.
  background_ran.get_future().wait();
  EXPECT_FALSE(demand_done.load());
  release_demand.set_value();
  EXPECT_TRUE(ahead_saw.get_future().get()) << "the read-ahead ran before the demand read ended";
  EXPECT_FALSE(gate->busy());
}

TEST(StreamOverlap, ABadReadAheadIsRefusedClearly) {
  const auto r = test::run_deltafin({"run", "--model", overlap_model().dir, "--prompt-ids", "5",
                                     "--max-new", "1", "--trunk-read-ahead", "-2"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--trunk-read-ahead"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace deltafin
