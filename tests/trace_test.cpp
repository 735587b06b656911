// `--trace FILE` through the real binary (docs/TRACING.md): a run whose experts stream under a
// small budget writes a Trace Event Format file that parses, whose every event has the fields
// the format needs, whose spans nest per thread, whose reads carry their bytes on reader
// threads, and whose pass spans add up to the pass time the engine measures itself. Checked on
// the file, not on timings: no assertion depends on how fast the machine is.
#include "core/trace.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "fixtures/synthetic.h"
#include "model/config.h"
#include "storage/checkpoint.h"
#include "storage/plan.h"
#include "test_util.h"

namespace deltafin {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The tiny preset under the smallest budget its plan takes: experts are read every pass.
struct TracedModel {
  std::string dir, budget;
};
const TracedModel& traced_model() {
  static const TracedModel m = [] {
    TracedModel t;
    t.dir = test::temp_dir("tracemodel") + "/model";
    make_model(t.dir, synthetic_preset("tiny"));
    const ModelConfig c = load_config(t.dir);
    auto ck = Checkpoint::open(t.dir);
    PlanOptions o;
    o.budget = 1ull << 40;
    o.shape.max_rows = 16;
    o.context = 256;
    o.shape.sequences = 1;
    t.budget = std::to_string(plan_memory(c, *ck, o).min_working_set / 1024 + 64) + "K";
    return t;
  }();
  return m;
}

std::vector<std::string> traced_run_args(const std::string& trace) {
  std::vector<std::string> a = {"run",
                                "--json",
                                "--model",
                                traced_model().dir,
                                "--ctx",
                                "256",
                                "--prompt-ids",
                                "5,17,200,3,99,42,7,300",
                                "--max-new",
                                "12",
                                "--prefill-chunk",
                                "16",
                                "--memory-budget",
                                traced_model().budget,
                                "--readers",
                                "2"};
  if (!trace.empty()) {
    a.push_back("--trace");
    a.push_back(trace);
  }
  return a;
}

struct TraceSpanRec {
  std::string name;
  double ts = 0, dur = 0;
};

TEST(Trace, RunWritesAValidNestedTimelineThatAccountsForThePasses) {
  const std::string dir = test::temp_dir("trace");
  const std::string path = dir + "/t.json";
  const auto r = test::run_deltafin(traced_run_args(path));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json stats = json::parse(r.out);
  ASSERT_GT(stats["expert_bytes_read"].get<double>(), 0) << "the budget should make experts stream";

  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  for (const auto& e : fs::directory_iterator(dir))  // the temporary was renamed, not left
    EXPECT_EQ(e.path().filename(), "t.json");

  const json t = json::parse(test::slurp(path));
  ASSERT_TRUE(t.is_object());
  EXPECT_EQ(t["displayTimeUnit"], "ms");
  ASSERT_TRUE(t["traceEvents"].is_array());
  EXPECT_EQ(t["otherData"]["dropped_events"], 0);
  EXPECT_EQ(t["otherData"]["events"].get<int64_t>() + 0,
            static_cast<int64_t>(std::count_if(t["traceEvents"].begin(), t["traceEvents"].end(),
                                               [](const json& e) { return e["ph"] != "M"; })));

  std::map<int, std::string> thread_names;
  std::map<int, std::vector<TraceSpanRec>> spans;  // per tid
  std::map<std::string, int> count;
  int counters = 0;
  int64_t read_bytes = 0;
  bool reads_off_main = true;
  for (const json& e : t["traceEvents"]) {
    ASSERT_TRUE(e.is_object());
    ASSERT_TRUE(e.contains("ph") && e["ph"].is_string()) << e.dump();
    ASSERT_TRUE(e.contains("name") && e["name"].is_string()) << e.dump();
    ASSERT_TRUE(e.contains("pid") && e["pid"].is_number_integer()) << e.dump();
    ASSERT_TRUE(e.contains("tid") && e["tid"].is_number_integer()) << e.dump();
    ASSERT_TRUE(e.contains("args") && e["args"].is_object()) << e.dump();
    const std::string ph = e["ph"];
    const int tid = e["tid"];
    if (ph == "M") {
      EXPECT_EQ(e["name"], "thread_name");
      ASSERT_TRUE(e["args"]["name"].is_string());
      EXPECT_TRUE(thread_names.emplace(tid, e["args"]["name"]).second) << "tid named twice";
      continue;
    }
    ASSERT_TRUE(e.contains("ts") && e["ts"].is_number()) << e.dump();
    EXPECT_GE(e["ts"].get<double>(), 0.0);
    if (ph == "C") {
      ++counters;
      for (const auto& [k, v] : e["args"].items()) EXPECT_TRUE(v.is_number()) << e.dump();
      continue;
    }
    ASSERT_EQ(ph, "X") << e.dump();
    ASSERT_TRUE(e.contains("cat") && e["cat"].is_string()) << e.dump();
    ASSERT_TRUE(e.contains("dur") && e["dur"].is_number()) << e.dump();
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    const std::string name = e["name"];
    ++count[name];
    spans[tid].push_back({name, e["ts"].get<double>(), e["dur"].get<double>()});
    if (name == "read") {
      ASSERT_TRUE(e["args"].contains("bytes") && e["args"].contains("drive")) << e.dump();
      EXPECT_GT(e["args"]["bytes"].get<int64_t>(), 0);
      read_bytes += e["args"]["bytes"].get<int64_t>();
    }
  }
  // Every thread that recorded is named; reads ran on reader threads.
  for (const auto& [tid, list] : spans) {
    ASSERT_TRUE(thread_names.count(tid)) << "tid " << tid << " has no thread_name";
    for (const auto& s : list) {
      if ((s.name == "read" || s.name == "trunk read") &&
          thread_names[tid].rfind("reader ", 0) != 0)
        reads_off_main = false;
    }
  }
  EXPECT_TRUE(reads_off_main);
  for (const char* n : {"pass", "layer", "attention", "router", "routed experts", "expert", "read",
                        "round", "sample", "lm head", "embed", "trunk read", "trunk wait",
                        "shared experts", "prefill", "decode"})
    EXPECT_GT(count[n], 0) << "no \"" << n << "\" span";
  EXPECT_GT(counters, 0);
  // The reads carry at least the expert bytes the run reports as landed (a read is of an expert's
  // whole image, and predictions the router then dropped were read too).
  EXPECT_GE(read_bytes, stats["expert_bytes_read"].get<int64_t>());
  EXPECT_EQ(count["pass"], stats["passes"].get<int>());

  // Nesting per thread: sorted by start (longer first on ties), each span lies within every
  // open span it starts in. RAII spans on one thread can only nest or follow each other.
  double pass_total_us = 0, pass_children_us = 0, decode_rounds_us = 0;
  for (auto& [tid, list] : spans) {
    std::sort(list.begin(), list.end(), [](const TraceSpanRec& a, const TraceSpanRec& b) {
      return a.ts < b.ts || (a.ts == b.ts && a.dur > b.dur);
    });
    std::vector<const TraceSpanRec*> open;
    for (const auto& s : list) {
      while (!open.empty() && s.ts >= open.back()->ts + open.back()->dur) open.pop_back();
      if (!open.empty()) {
        EXPECT_LE(s.ts + s.dur, open.back()->ts + open.back()->dur + 1e-3)
            << s.name << " overlaps the end of " << open.back()->name << " on tid " << tid;
        if (open.back()->name == "pass") pass_children_us += s.dur;
        // A decode round's pass (the rounds after the prompt's, which gave the first token).
        if (open.back()->name == "round" && s.name == "decode")
          decode_rounds_us += open.back()->dur;
      }
      if (s.name == "pass") pass_total_us += s.dur;
      open.push_back(&s);
    }
  }
  // The decode rounds add up to the decode time the engine measures (first token to last, its
  // own clock): every millisecond of decoding is inside a span.
  const double decode_s = stats["decode_s"];
  ASSERT_GT(decode_s, 0);
  EXPECT_EQ(count["decode"], stats["completion_tokens"].get<int>() - 1);
  EXPECT_NEAR(decode_rounds_us / 1e6, decode_s, 0.05 * decode_s);
  // And each pass's own children (embedding, layers, LM head) account for the pass.
  EXPECT_GE(pass_children_us, 0.95 * pass_total_us);
  EXPECT_LE(pass_children_us, pass_total_us * (1 + 1e-6) + 1);
}

TEST(Trace, AnUnwritablePathFailsBeforeTheRun) {
  const std::string dir = test::temp_dir("tracebad");
  // A missing folder and a folder as the file: both refused at start, naming the path.
  for (const std::string& bad : {dir + "/no/such/folder/t.json", dir}) {
    const auto r = test::run_deltafin(traced_run_args(bad));
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("--trace " + bad), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "") << "the run should not have started";
  }
  EXPECT_TRUE(fs::is_empty(dir)) << "nothing left behind";
}

// The cap, through the library: events past it are dropped and counted, and the file says so.
TEST(Trace, EventsPastTheCapAreCountedAsDropped) {
  const std::string path = test::temp_dir("tracecap") + "/cap.json";
  trace_start(path, 10);
  trace_thread_name("capped");
  for (int i = 0; i < 25; ++i) TraceSpan span("step", "test", {{"i", i}});
  EXPECT_EQ(trace_finish(), 10);
  EXPECT_FALSE(trace_on());
  { TraceSpan after("after", "test"); }  // off again: nothing recorded, nothing written
  const json t = json::parse(test::slurp(path));
  EXPECT_EQ(t["otherData"]["event_cap"], 10);
  EXPECT_EQ(t["otherData"]["dropped_events"], 15);
  int steps = 0;
  for (const json& e : t["traceEvents"]) {
    if (e["ph"] == "M") continue;
    EXPECT_EQ(e["name"], "step");
    EXPECT_EQ(e["args"]["i"], steps++);  // the first ten are kept
  }
  EXPECT_EQ(steps, 10);
  EXPECT_EQ(trace_finish(), 0);  // a second finish writes nothing
}

TEST(Trace, WithoutTraceNoFileIsWritten) {
  const std::string dir = test::temp_dir("tracenone");
  const auto before = fs::current_path();
  fs::current_path(dir);
  const auto r = test::run_deltafin(traced_run_args(""));
  fs::current_path(before);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::is_empty(dir));
  EXPECT_EQ(r.err.find("trace:"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace deltafin
