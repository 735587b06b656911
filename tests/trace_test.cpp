// `--trace FILE` through the real binary (docs/TRACING.md): a run whose experts stream under a
// small budget writes a Trace Event Format file that parses, whose every event has the fields
// the format needs, whose spans nest per thread, whose reads carry their bytes on reader
// threads, and whose pass spans add up to the pass time the engine measures itself; with a home
// the reads per drive add up to the run's per-drive report; and `bench` in the trunk-streaming
// regime reports its bytes split into trunk and experts, accounted for by its spans. Checked on
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
#include "streaming_util.h"
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
  static const TracedModel m{
      test::tiny_stream_model().dir,
      std::to_string(test::tiny_stream_model().min_working_set / 1024 + 64) + "K"};
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
    if (name == "read" || name == "trunk read") {
      // Each read says its drive, its bytes, how long it queued and what ran beside it.
      for (const char* k : {"bytes", "drive", "queued_us", "in_flight"})
        ASSERT_TRUE(e["args"].contains(k)) << k << " missing: " << e.dump();
      EXPECT_GT(e["args"]["bytes"].get<int64_t>(), 0);
      EXPECT_GE(e["args"]["queued_us"].get<int64_t>(), 0) << e.dump();
      EXPECT_GE(e["args"]["in_flight"].get<int64_t>(), 1) << e.dump();
      if (name == "read") read_bytes += e["args"]["bytes"].get<int64_t>();
      if (name == "trunk read") {
        EXPECT_EQ(e["args"]["drive"], 0) << e.dump();
      }
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

// Every span of a trace file with its thread's name and arguments.
struct TracedSpan {
  std::string thread, name;
  double ts = 0, dur = 0;
  json args;
};
std::vector<TracedSpan> traced_spans(const std::string& path) {
  const json t = json::parse(test::slurp(path));
  std::map<int, std::string> names;
  for (const json& e : t["traceEvents"])
    if (e["ph"] == "M") names[e["tid"].get<int>()] = e["args"]["name"];
  std::vector<TracedSpan> out;
  for (const json& e : t["traceEvents"]) {
    if (e["ph"] != "X") continue;
    out.push_back({names[e["tid"].get<int>()], e["name"], e["ts"].get<double>(),
                   e["dur"].get<double>(), e["args"]});
  }
  return out;
}

// Per-drive reads: with a home beside the model folder, each drive's `read` spans carry exactly
// the bytes the run's own per-drive report says that drive served.
TEST(Trace, ReadSpansPerDriveAddUpToEachDrivesReport) {
  const std::string base = test::temp_dir("tracehome");
  const std::string model = base + "/model", home = base + "/home";
  make_model(model, synthetic_preset("tiny"));
  auto placed = test::run_deltafin(
      {"place", "--model", model, "--home", home, "--probe-size", "1M", "--quiet"});
  ASSERT_EQ(placed.exit_code, 0) << placed.err;
  auto args = traced_run_args(base + "/t.json");
  args[3] = model;  // "--model" DIR
  args.insert(args.end(), {"--home", home, "--no-direct-io"});
  const auto r = test::run_deltafin(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json stats = json::parse(r.out);
  ASSERT_TRUE(stats.contains("homes")) << stats.dump();
  ASSERT_EQ(stats["homes"].size(), 2u) << stats.dump();
  std::map<int, int64_t> bytes, reads;
  for (const TracedSpan& s : traced_spans(base + "/t.json")) {
    if (s.name != "read") continue;
    EXPECT_EQ(s.thread.rfind("reader ", 0), 0u) << s.thread;
    bytes[s.args["drive"].get<int>()] += s.args["bytes"].get<int64_t>();
    reads[s.args["drive"].get<int>()]++;
  }
  for (int d = 0; d < 2; ++d) {
    const json& h = stats["homes"][static_cast<size_t>(d)];
    EXPECT_GT(reads[d], 0) << "no read span for drive " << d << ": " << h.dump();
    EXPECT_EQ(bytes[d], h["bytes_read"].get<int64_t>()) << "drive " << d << ": " << h.dump();
    EXPECT_EQ(reads[d], h["reads"].get<int64_t>()) << "drive " << d << ": " << h.dump();
  }
  EXPECT_EQ(bytes.size(), 2u) << "reads from a drive that does not exist";
}

// `bench` in the trunk-streaming regime (the tiny preset at its smallest budget: the trunk and
// the experts stream every pass): the report splits the bytes per token into trunk and experts,
// per pass and per token consistently, and states the I/O roofline and the bound; the trace of the
// same run accounts for the decode time bench measured — the passes inside its measured decode
// phases add up to it within 5% — and its read spans carry the bytes the report counts.
TEST(Trace, BenchInTheTrunkStreamingRegimeIsAccountedForByItsSpans) {
  const std::string path = test::temp_dir("tracebench") + "/b.json";
  const auto r = test::run_deltafin({"bench", "--json", "--model", traced_model().dir, "--ctx",
                                     "256", "--memory-budget", traced_model().budget, "--readers",
                                     "2", "--prompt-tokens", "8", "--gen-tokens", "6", "--reps",
                                     "2", "--trace", path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  const double tokens = j["gen_tokens"].get<double>() * j["reps"].get<double>();
  const double passes = j["target_passes"];
  const double trunk = j["trunk_bytes_streamed_per_token"],
               experts = j["expert_bytes_read_per_token"];
  ASSERT_GT(trunk, 0) << "the budget should make the trunk stream: " << j.dump();
  ASSERT_GT(experts, 0) << j.dump();
  EXPECT_NEAR(j["bytes_per_token"].get<double>(), trunk + experts, 1e-6 * (trunk + experts));
  EXPECT_NEAR(j["trunk_bytes_streamed_per_pass"].get<double>() * passes, trunk * tokens,
              1e-6 * trunk * tokens);
  EXPECT_NEAR(j["expert_bytes_read_per_pass"].get<double>() * passes, experts * tokens,
              1e-6 * experts * tokens);
  EXPECT_EQ(passes, tokens) << "no drafter: one pass per token";
  EXPECT_EQ(j["bound_from"], "compute time") << "no in-RAM reference while the trunk streams";
  EXPECT_GT(j["compute_bound_tokens_per_s"].get<double>(), 0);
  if (j["disk_bandwidth_bytes_per_s"].get<double>() > 0) {
    EXPECT_NEAR(
        j["io_roofline_tokens_per_s"].get<double>(),
        j["disk_bandwidth_bytes_per_s"].get<double>() / j["bytes_read_per_token"].get<double>(),
        1e-6 * j["io_roofline_tokens_per_s"].get<double>());
    EXPECT_LE(j["decode_bound_tokens_per_s"].get<double>(),
              j["io_roofline_tokens_per_s"].get<double>() * (1 + 1e-9));
  }

  // The measured decode phases and what lies inside them, on the main thread and the readers.
  const auto spans = traced_spans(path);
  std::vector<std::pair<double, double>> phases;  // measured decode phases [start, end)
  for (const auto& s : spans) {
    if (s.name == "bench decode" && s.args["measured"] == 1) {
      EXPECT_EQ(s.thread, "main");
      phases.emplace_back(s.ts, s.ts + s.dur);
    }
  }
  ASSERT_EQ(phases.size(), 2u);
  auto inside = [&](const TracedSpan& s) {
    for (const auto& [a, b] : phases)
      if (s.ts >= a && s.ts + s.dur <= b) return true;
    return false;
  };
  double pass_us = 0;
  int pass_count = 0, layers = 0;
  for (const auto& s : spans) {
    if (!inside(s) || s.thread != "main") continue;
    if (s.name == "pass") pass_us += s.dur, ++pass_count;
    if (s.name == "layer") ++layers;
  }
  const double decode_s = j["s_per_token"].get<double>() * tokens;
  EXPECT_EQ(pass_count, passes);
  EXPECT_EQ(layers, pass_count * load_config(traced_model().dir).num_layers);
  // Every token's time is in its pass: the passes add up to bench's own decode time (the argmax
  // between passes is all that lies outside them).
  EXPECT_NEAR(pass_us / 1e6, decode_s, 0.05 * decode_s);
}

}  // namespace
}  // namespace deltafin
