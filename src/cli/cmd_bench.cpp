// `deltafin bench`: prefill and decode speed on synthetic token ids, with a warm-up and
// repetitions (median, min, max), next to what bounds the run: the weight bytes a decoded token
// touches in RAM against the measured memory bandwidth, and the bytes it had to fetch from
// storage against the measured disk bandwidth (an O_DIRECT sequential probe of the model's own
// files). roofline_s_per_token = max(storage bytes / disk bandwidth, RAM bytes / memory
// bandwidth) per decoded token — the time a perfectly overlapped run would take — and
// roofline_ratio = roofline / achieved (1.0 = at the bound). Prefill has its own bound: the
// prompt's passes (--prefill-chunk, auto by default: as few as the memory budget allows) read
// prefill_bytes_per_token from storage and compute prefill_flops_per_token, so
// prefill_roofline_s_per_token = max(bytes / disk bandwidth, FLOPs / the measured FMA peak of
// all threads), and prefill_roofline_ratio = that / the achieved prefill s per token. Figures
// only; no assertions.
// --report writes the same figures as charts (bench_report.cpp). --image FILE (repeatable) adds
// the vision tower's cost per image (bench_vision.cpp) as the "vision" object and lines.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "cli/bench_constraint.h"
#include "cli/bench_prompt.h"
#include "cli/bench_report.h"
#include "cli/bench_runs.h"
#include "cli/bench_turns.h"
#include "cli/bench_vision.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/gen_options.h"
#include "cli/trace_option.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/sysinfo.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "generate/driver.h"
#include "gpu/gpu.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "storage/expert_store.h"
#include "storage/trunk_units.h"

namespace deltafin::cli {

namespace {
struct BenchArgs {
  EngineOptions engine;
  std::string trace;  // --trace FILE
  int prompt_tokens = 64;
  std::string prefill_chunk = "auto";
  int gen_tokens = 16;
  int reps = 3;
  bool json = false;
  bool no_disk_probe = false;
  bool in_ram_reference = true;
  std::string report;  // HTML report file ("" = none)
  DraftOptions draft;
  int turns = 0;  // --turns: a multi-turn conversation with and without state reuse
  StateCacheSettings state_cache;
  GenOptions gen;  // only --grammar-file / --json-schema: decode with and without them
  std::optional<float> constraint_temperature;  // --temperature, with a constraint only (1)
  std::vector<std::string> images;              // --image: the vision tower's cost per image
};

struct Summary {
  double median = 0, min = 0, max = 0;
};

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return s;
}

// The tokens a --turns conversation reaches.
int64_t req_tokens(const BenchArgs& a) {
  return int64_t{a.turns} * (a.prompt_tokens + a.gen_tokens);
}

// Floating-point operations of a prompt of T tokens, per token: every trunk matrix of every
// layer once per row (2 per weight), the top-k routed experts of each MoE layer, MLA attention
// over the positions before each row (scores over the latent + rope width, values over the
// latent), and the KDA recurrence (~8 dk^2 per head and row: the state read for the output,
// the prediction k^T S and the rank-1 update). The LM head runs on the last row only.
double prefill_flops_per_token(const LoadedModel& m, int64_t T) {
  const ModelConfig& c = m.config();
  double weights = 0;
  for (int i = 0; i < c.num_layers; ++i) {
    for (const auto& name : layer_trunk_tensors(c, i, m.checkpoint())) {
      const TensorInfo& t = m.checkpoint().get(name);
      if (t.shape.size() == 2 && t.shape[0] > 1) weights += static_cast<double>(t.numel());
    }
  }
  const double expert = 3.0 * static_cast<double>(c.moe.intermediate * c.expert_dim());
  weights += static_cast<double>(c.num_moe_layers() * c.moe.top_k) * expert;
  const double avg_pos = static_cast<double>(T + 1) / 2;
  const double mla = static_cast<double>(c.num_mla_layers() * c.mla.num_heads) * avg_pos *
                     static_cast<double>(c.mla.cache_width() + c.mla.kv_lora_rank);
  const double kda = static_cast<double>(c.num_kda_layers() * c.kda.num_heads) * 4.0 *
                     static_cast<double>(c.kda.head_dim * c.kda.head_dim);
  const double head = static_cast<double>(c.vocab * c.hidden) / static_cast<double>(T);
  return 2.0 * (weights + mla + kda + head);
}

// The load request of the flags, checked, and the memory probe that runs before the model
// loads: its buffer (256 MiB) is freed and the peak RSS starts over, so the peak this run reports
// is the engine's (budget + fixed overhead).
LoadedEngine load_for_bench(BenchArgs& a, bool constrained, double& mem_bw) {
  if (a.prompt_tokens < 1 || a.gen_tokens < 1 || a.reps < 1) {
    fail_usage("--prompt-tokens, --gen-tokens and --reps must be at least 1");
  }
  if (!a.report.empty()) check_output_target(a.report);  // before the benchmark runs
  if (constrained && a.turns > 0) fail_usage("--turns and a constraint are separate benchmarks");
  if (!constrained && a.constraint_temperature)
    fail_usage("--temperature applies to bench with --json-schema or --grammar-file");
  if (!a.images.empty() && (constrained || a.turns > 0))
    fail_usage("--image is measured beside prefill and decode, not with --turns or a constraint");
  a.engine.model = resolve_model_dir(a.engine.model);
  // Passes of --prefill-chunk rows (auto: as many as the budget holds, up to the prompt), and
  // at least a verify pass's rows when drafting.
  LoadRequest req = load_request(a.engine, a.draft, a.prefill_chunk);
  req.prompt_rows = a.prompt_tokens;
  // Prefill and decode are measured without reuse; --turns measures it.
  if (a.turns > 0) {
    req.state_cache = a.state_cache;
    req.prompt_rows = req_tokens(a);
  }
  if (constrained) {
    req.tokenizer = NeedTokenizer::kRequired;
    req.who = "bench with a constraint";
  }
  apply_engine_options(req.engine);
  mem_bw = constrained ? 0.0 : measure_memory_bandwidth(global_pool().size());
  reset_peak_rss();
  LoadedEngine engine = load_engine(std::move(req));
  note_demo_drafter(a.engine.model, engine.draft);
  return engine;
}

// --turns: a conversation with and without state reuse (bench_turns.cpp).
void run_turns(const BenchArgs& a, LoadedEngine& engine) {
  const LoadedModel& model = *engine.model;
  if (!engine.store) fail_usage("--turns measures state reuse: drop --state-cache none");
  const int64_t ctx = model.plan() ? model.plan()->context : model.config().max_positions;
  if (req_tokens(a) > ctx) {
    fail_usage(
        "--turns {} x (--prompt-tokens {} + --gen-tokens {}) = {} tokens, more than the "
        "context of {} positions",
        a.turns, a.prompt_tokens, a.gen_tokens, req_tokens(a), ctx);
  }
  nlohmann::json turns = bench_turns(engine, a.turns, a.prompt_tokens, a.gen_tokens, !a.json);
  if (a.json) {
    nlohmann::json j = {{"model", a.engine.model},
                        {"cpu", cpu_model_name()},
                        {"threads", global_pool().size()},
                        {"turns", turns}};
    fmt::print("{}\n", j.dump());
  }
}

nlohmann::json gpu_json(const gpu::Stats& g, int64_t passes) {
  return nlohmann::json{{"device_products", g.products},
                        {"cpu_products", g.declined},
                        {"device_seconds", g.seconds},
                        {"device_flops", g.flops},
                        {"uploaded_bytes", g.uploaded_bytes},
                        {"uploaded_bytes_per_pass",
                         g.uploaded_bytes / static_cast<uint64_t>(std::max<int64_t>(passes, 1))},
                        {"grouped_expert_products", g.grouped_products},
                        {"expert_uploaded_bytes", g.expert_bytes},
                        {"overlapped_upload_bytes", g.overlapped_bytes}};
}

// The figures of the measured runs against their bounds (the file comment says which), as the
// JSON object --json prints and the text and the report are written from. `drive_bw`: each
// drive's probed bandwidth (empty with --no-disk-probe).
nlohmann::json bench_figures(const BenchArgs& a, const LoadedEngine& engine, const BenchRuns& r,
                             double mem_bw, const std::vector<double>& drive_bw) {
  const LoadedModel& model = *engine.model;
  const DecodeTotals& dec = r.dec;
  const PrefillTotals& pre = r.pre;
  const double n_tok = static_cast<double>(std::max<int64_t>(1, dec.tokens));
  const double experts_per_pass =
      dec.passes > 0 ? static_cast<double>(dec.expert_fetches) / dec.passes : 0;
  const double ram_bytes_per_token = static_cast<double>(model.trunk_bytes_per_pass()) +
                                     experts_per_pass * static_cast<double>(model.expert_bytes());
  const double expert_read = static_cast<double>(dec.experts.bytes_read) / n_tok;
  const double trunk_read = static_cast<double>(dec.trunk_streamed) / n_tok;
  const double storage_read = static_cast<double>(dec.storage_read) / n_tok;
  // What this run had to fetch: the store's own reads, or in mmap mode the page-cache misses.
  const double bytes_read =
      a.engine.mmap ? storage_read : std::max(expert_read + trunk_read, storage_read);
  const uint64_t requests = dec.experts.requests, hits = dec.experts.hits;
  double disk_bw = 0.0;
  for (double b : drive_bw) disk_bw += b;
  const Summary ps = summarize(r.prefill_tps), ds = summarize(r.decode_tps);
  // Prefill against its bound.
  const double n_pre = static_cast<double>(std::max<int64_t>(1, pre.tokens));
  const double pre_storage = static_cast<double>(pre.storage_read) / n_pre;
  const double pre_bytes =
      a.engine.mmap
          ? pre_storage
          : std::max(static_cast<double>(pre.expert_read + pre.trunk_read) / n_pre, pre_storage);
  const double pre_flops = prefill_flops_per_token(model, a.prompt_tokens);
  const double peak = kernels::fma_peak_flops(global_pool());
  const double pre_achieved = pre.seconds / n_pre;
  const double pre_disk_time = disk_bw > 0 ? pre_bytes / disk_bw : 0.0;
  const double pre_compute_time = peak > 0 ? pre_flops / peak : 0.0;
  const double pre_roofline = std::max(pre_disk_time, pre_compute_time);
  const Summary ts = summarize(r.ttft);
  const double achieved = dec.seconds / n_tok;
  const double disk_time = disk_bw > 0 ? bytes_read / disk_bw : 0.0;
  // The physical limit of a decoded token out of core: the slower of reading its bytes at the
  // drives' bandwidth and computing it in RAM.
  const Summary in_ram = r.in_ram_tps.empty() ? Summary{} : summarize(r.in_ram_tps);
  const double io_tps = disk_time > 0 ? 1.0 / disk_time : 0.0;
  const double bound = io_tps > 0 ? std::min(io_tps, in_ram.median) : in_ram.median;
  const double ram_time = mem_bw > 0 ? ram_bytes_per_token / mem_bw : 0.0;
  const double roofline = std::max(disk_time, ram_time);
  const double io_wait = (dec.experts.io_wait_s + dec.trunk_wait) / n_tok;
  uint64_t rh = 0, rr = 0;
  for (const auto& l : model.prefetch_recall()) rh += l.predicted_hits, rr += l.requested;

  nlohmann::json j;
  j["model"] = a.engine.model;
  j["threads"] = global_pool().size();
  j["kernels"] = kernels::active().name;
  j["cpu"] = cpu_model_name();
  j["mode"] = a.engine.mmap ? "mmap" : "store";
  if (model.plan()) {
    j["memory_budget_bytes"] = model.plan()->budget;
    j["expert_cache_bytes"] = model.plan()->expert_cache_bytes;
    j["trunk_resident_bytes"] = model.plan()->trunk_resident_bytes;
  }
  const gpu::Backend* gpu = model.gpu().get();
  j["gpu"] = gpu != nullptr ? gpu->info().describe() : std::string("none");
  if (gpu != nullptr) {
    j["gpu_prefill"] = gpu_json(r.gpu_prefill, pre.passes);
    j["gpu_decode"] = gpu_json(r.gpu_decode, dec.passes);
    j["gpu_plan"] = model.gpu_plan().describe();
  }
  j["prompt_tokens"] = a.prompt_tokens;
  j["gen_tokens"] = a.gen_tokens;
  j["reps"] = a.reps;
  j["prefill_tokens_per_s"] = ps.median;
  j["prefill_tokens_per_s_min"] = ps.min;
  j["prefill_tokens_per_s_max"] = ps.max;
  j["prefill_chunk"] = model.pass_plan().pass_rows;
  j["prefill_chunk_auto"] = model.pass_plan().automatic;
  j["prefill_passes_per_prompt"] = static_cast<double>(pre.passes) / std::max(1, a.reps);
  j["ttft_s"] = ts.median;
  j["prefill_bytes_per_token"] = pre_bytes;
  j["prefill_expert_bytes_per_token"] = static_cast<double>(pre.expert_read) / n_pre;
  j["prefill_trunk_bytes_per_token"] = static_cast<double>(pre.trunk_read) / n_pre;
  j["prefill_flops_per_token"] = pre_flops;
  j["prefill_flops_per_s"] = pre_achieved > 0 ? pre_flops / pre_achieved : 0.0;
  j["fma_peak_flops_per_s"] = peak;
  j["prefill_roofline_disk_s_per_token"] = pre_disk_time;
  j["prefill_roofline_compute_s_per_token"] = pre_compute_time;
  j["prefill_roofline_s_per_token"] = pre_roofline;
  j["prefill_roofline_ratio"] = pre_achieved > 0 ? pre_roofline / pre_achieved : 0.0;
  j["decode_tokens_per_s"] = ds.median;
  j["decode_tokens_per_s_min"] = ds.min;
  j["decode_tokens_per_s_max"] = ds.max;
  j["s_per_token"] = achieved;
  j["decode_weight_bytes_per_token"] = ram_bytes_per_token;
  j["decode_experts_per_token"] = experts_per_pass;
  j["effective_weight_bandwidth_bytes_per_s"] = achieved > 0 ? ram_bytes_per_token / achieved : 0.0;
  j["memory_bandwidth_bytes_per_s"] = mem_bw;
  j["disk_bandwidth_bytes_per_s"] = disk_bw;
  j["bytes_read_per_token"] = bytes_read;
  j["expert_bytes_read_per_token"] = expert_read;
  j["trunk_bytes_streamed_per_token"] = trunk_read;
  j["storage_read_bytes_per_token"] = storage_read;
  j["expert_hit_rate"] =
      requests > 0 ? static_cast<double>(hits) / static_cast<double>(requests) : 0.0;
  j["io_wait_s_per_token"] = io_wait;
  j["compute_s_per_token"] = std::max(0.0, achieved - io_wait);
  j["read_gb_per_s"] = achieved > 0 ? bytes_read / achieved / 1e9 : 0.0;
  j["prefetch_issued"] = dec.experts.prefetch_issued;
  j["prefetch_used"] = dec.experts.prefetch_used;
  j["prefetch_wasted_bytes"] = dec.experts.prefetch_wasted_bytes;
  j["prefetch_recall"] = rr > 0 ? static_cast<double>(rh) / static_cast<double>(rr) : 0.0;
  j["roofline_disk_s_per_token"] = disk_time;
  j["roofline_memory_s_per_token"] = ram_time;
  j["roofline_s_per_token"] = roofline;
  j["roofline_ratio"] = achieved > 0 ? roofline / achieved : 0.0;
  if (!r.in_ram_tps.empty()) {
    j["in_ram_decode_tokens_per_s"] = in_ram.median;
    j["in_ram_decode_tokens_per_s_min"] = in_ram.min;
    j["in_ram_decode_tokens_per_s_max"] = in_ram.max;
    j["in_ram_hit_rate"] = r.in_ram_hit_rate;
    j["io_roofline_tokens_per_s"] = io_tps;
    j["decode_bound_tokens_per_s"] = bound;
    j["decode_to_bound_ratio"] = bound > 0 ? ds.median / bound : 0.0;
  }
  j["peak_rss_bytes"] = peak_rss_bytes();
  if (!dec.experts.sources.empty()) {
    // Per drive over the measured decode phases, with this run's probe of it.
    j["homes"] = sources_json(dec.experts.sources);
    for (size_t i = 0; i < j["homes"].size() && i < drive_bw.size(); ++i)
      j["homes"][i]["bench_probe_bytes_per_s"] = drive_bw[i];
  }
  j["expert_bytes"] = model.expert_bytes();
  j["prefill_tokens_per_s_reps"] = r.prefill_tps;
  j["decode_tokens_per_s_reps"] = r.decode_tps;
  j["draft"] = engine.draft;
  j["draft_proposed"] = r.drafted.proposed;
  j["draft_accepted"] = r.drafted.accepted;
  j["draft_acceptance_rate"] = r.drafted.acceptance();
  j["target_passes"] = dec.passes;
  j["tokens_per_pass"] = dec.passes > 0 ? static_cast<double>(dec.tokens) / dec.passes : 0.0;
  j["bytes_per_token"] = expert_read + trunk_read;
  // The trunk-streaming regime (issue 37 item 1): a pass streams the non-resident trunk once for
  // all its rows, so per pass is the trunk's own unit and per token falls as a verify pass carries
  // more tokens. With a drafter the tokens are the verified (emitted) ones.
  const double n_pass = static_cast<double>(std::max<int64_t>(1, dec.passes));
  j["trunk_bytes_streamed_per_pass"] = static_cast<double>(dec.trunk_streamed) / n_pass;
  j["expert_bytes_read_per_pass"] = static_cast<double>(dec.experts.bytes_read) / n_pass;
  // The trunk's read-ahead as planned (units read ahead of the one computing) and as it ran (the
  // most units read or being read ahead at once).
  if (model.plan() && model.plan()->stream_buffers > 0) {
    j["trunk_read_ahead_units"] = model.plan()->stream_buffers - 1;
    j["trunk_read_ahead_peak"] = model.trunk_stats().read_ahead_peak;
  }
  if (engine.draft != "none") j["bytes_per_verified_token"] = expert_read + trunk_read;
  // Where no in-RAM reference ran (the trunk streams, or the cache cannot hold a pass's experts),
  // the bound's in-RAM side is this run's own compute time: the pace with no wait for a read.
  const double compute_s = std::max(0.0, achieved - io_wait);
  if (io_tps > 0) {
    j["io_roofline_tokens_per_s"] = io_tps;
    j["io_roofline_ratio"] = ds.median / io_tps;
  }
  if (r.in_ram_tps.empty() && compute_s > 0) {
    const double compute_tps = 1.0 / compute_s;
    const double b = io_tps > 0 ? std::min(io_tps, compute_tps) : compute_tps;
    j["compute_bound_tokens_per_s"] = compute_tps;
    j["decode_bound_tokens_per_s"] = b;
    j["decode_to_bound_ratio"] = ds.median / b;
    j["bound_from"] = "compute time";
  } else if (!r.in_ram_tps.empty()) {
    j["bound_from"] = "in-RAM reference";
  }
  return j;
}

// The figures as text, one labelled line per subject.
void print_figures(const nlohmann::json& j, const LoadedModel& model, const BenchRuns& r,
                   const std::vector<double>& drive_bw) {
  auto num = [&j](const char* k) { return j.value(k, 0.0); };
  const ModelConfig& c = model.config();
  const int reps = j["reps"].get<int>();
  fmt::print("model      {} ({} layers, hidden {}, {} experts top-{}, vocab {}), {}\n",
             j["model"].get<std::string>(), c.num_layers, c.hidden, c.moe.num_experts, c.moe.top_k,
             c.vocab, model.describe());
  fmt::print("machine    {}, {} threads, kernels {}\n", j["cpu"].get<std::string>(),
             j["threads"].get<int>(), j["kernels"].get<std::string>());
  if (model.gpu() == nullptr) {
    fmt::print("gpu        none: every product on the CPU\n");
  } else {
    auto phase = [](const gpu::Stats& g, int64_t passes) {
      return fmt::format(
          "{} products on the device ({:.3f} s, {:.1f} GFLOP, {:.3f} GB uploaded, {:.2f} MB "
          "per pass), {} on the CPU; routed experts: {} grouped products, {:.3f} GB uploaded, "
          "{:.0f}% of it while the device computed",
          g.products, g.seconds, g.flops / 1e9, static_cast<double>(g.uploaded_bytes) / 1e9,
          static_cast<double>(g.uploaded_bytes) / 1e6 /
              static_cast<double>(std::max<int64_t>(passes, 1)),
          g.declined, g.grouped_products, static_cast<double>(g.expert_bytes) / 1e9,
          g.expert_bytes > 0 ? 100.0 * static_cast<double>(g.overlapped_bytes) /
                                   static_cast<double>(g.expert_bytes)
                             : 0.0);
    };
    fmt::print("gpu        {}\n", j["gpu"].get<std::string>());
    fmt::print("gpu        prefill: {}\n", phase(r.gpu_prefill, r.pre.passes));
    fmt::print("gpu        decode: {}\n", phase(r.gpu_decode, r.dec.passes));
  }
  fmt::print(
      "prefill    {:.2f} tokens/s median (min {:.2f}, max {:.2f}) over {} reps of {} tokens\n",
      num("prefill_tokens_per_s"), num("prefill_tokens_per_s_min"), num("prefill_tokens_per_s_max"),
      reps, j["prompt_tokens"].get<int>());
  fmt::print(
      "prefill    {} passes of up to {} rows{}, time to first token {:.3f} s; {:.4f} GB read per "
      "prompt token, {:.2f} GFLOP per token at {:.1f} GFLOP/s\n",
      num("prefill_passes_per_prompt"), model.pass_plan().pass_rows,
      model.pass_plan().automatic ? " (auto)" : "", num("ttft_s"),
      num("prefill_bytes_per_token") / 1e9, num("prefill_flops_per_token") / 1e9,
      num("prefill_flops_per_s") / 1e9);
  fmt::print(
      "prefill    roofline {:.5f} s/token = max(storage {:.5f}, compute {:.5f} at the FMA peak "
      "{:.1f} GFLOP/s); achieved {:.5f} -> ratio {:.2f}\n",
      num("prefill_roofline_s_per_token"), num("prefill_roofline_disk_s_per_token"),
      num("prefill_roofline_compute_s_per_token"), num("fma_peak_flops_per_s") / 1e9,
      r.pre.seconds / static_cast<double>(std::max<int64_t>(1, r.pre.tokens)),
      num("prefill_roofline_ratio"));
  fmt::print(
      "decode     {:.3f} tokens/s median (min {:.3f}, max {:.3f}), {:.4f} s/token, {} tokens per "
      "rep\n",
      num("decode_tokens_per_s"), num("decode_tokens_per_s_min"), num("decode_tokens_per_s_max"),
      num("s_per_token"), j["gen_tokens"].get<int>());
  fmt::print(
      "weights    {:.3f} GB touched per decoded token ({:.1f} experts), {:.2f} GB/s effective; "
      "memory {:.2f} GB/s\n",
      num("decode_weight_bytes_per_token") / 1e9, num("decode_experts_per_token"),
      num("effective_weight_bandwidth_bytes_per_s") / 1e9,
      num("memory_bandwidth_bytes_per_s") / 1e9);
  fmt::print(
      "storage    {:.3f} GB read per token (experts {:.3f}, trunk {:.3f}), hit rate {:.1f}%, disk "
      "{:.2f} GB/s "
      "(O_DIRECT probe), I/O wait {:.3f} s/token\n",
      num("bytes_read_per_token") / 1e9, num("expert_bytes_read_per_token") / 1e9,
      num("trunk_bytes_streamed_per_token") / 1e9, 100.0 * num("expert_hit_rate"),
      num("disk_bandwidth_bytes_per_s") / 1e9, num("io_wait_s_per_token"));
  const auto& sources = r.dec.experts.sources;
  for (size_t i = 0; i < sources.size(); ++i) {
    fmt::print("drive      {}{}\n", describe_source(sources[i]),
               i < drive_bw.size() ? fmt::format("; bench probe {:.2f} GB/s", drive_bw[i] / 1e9)
                                   : std::string());
  }
  if (num("trunk_bytes_streamed_per_pass") > 0) {
    fmt::print("per pass   {:.3f} GB of trunk streamed + {:.3f} GB of experts read{}\n",
               num("trunk_bytes_streamed_per_pass") / 1e9, num("expert_bytes_read_per_pass") / 1e9,
               j.contains("trunk_read_ahead_units")
                   ? fmt::format("; trunk read ahead {} unit(s)", num("trunk_read_ahead_units"))
                   : std::string());
  }
  if (j["draft"] != "none") {
    fmt::print(
        "drafting   {}: {} proposed, {} accepted ({:.0f}%), {:.2f} tokens per target pass, "
        "{:.3f} GB read per verified token\n",
        j["draft"].get<std::string>(), r.drafted.proposed, r.drafted.accepted,
        100.0 * r.drafted.acceptance(), num("tokens_per_pass"),
        num("bytes_per_verified_token") / 1e9);
  }
  const auto& e = r.dec.experts;
  if (e.prefetch_issued > 0) {
    fmt::print("prefetch   recall {:.1f}%, {} issued, {} used, {:.3f} GB wasted\n",
               100.0 * num("prefetch_recall"), e.prefetch_issued, e.prefetch_used,
               static_cast<double>(e.prefetch_wasted_bytes) / 1e9);
  }
  fmt::print(
      "roofline   {:.4f} s/token = max(storage {:.4f}, memory {:.4f}); achieved {:.4f} -> ratio "
      "{:.2f}\n",
      num("roofline_s_per_token"), num("roofline_disk_s_per_token"),
      num("roofline_memory_s_per_token"), num("s_per_token"), num("roofline_ratio"));
  if (j.contains("in_ram_decode_tokens_per_s")) {
    fmt::print(
        "bound      in-RAM decode of the same dimensions {:.3f} tokens/s (hit rate {:.0f}%), I/O "
        "roofline {:.3f} tokens/s -> bound {:.3f}; achieved {:.3f} -> ratio {:.2f}\n",
        num("in_ram_decode_tokens_per_s"), 100.0 * num("in_ram_hit_rate"),
        num("io_roofline_tokens_per_s"), num("decode_bound_tokens_per_s"),
        num("decode_tokens_per_s"), num("decode_to_bound_ratio"));
  } else if (j.contains("compute_bound_tokens_per_s")) {
    fmt::print(
        "bound      compute with no read waited for {:.3f} tokens/s (this run's compute time), I/O "
        "roofline {:.3f} tokens/s -> bound {:.3f}; achieved {:.3f} -> ratio {:.2f}\n",
        num("compute_bound_tokens_per_s"), num("io_roofline_tokens_per_s"),
        num("decode_bound_tokens_per_s"), num("decode_tokens_per_s"), num("decode_to_bound_ratio"));
  }
  if (j.contains("io_roofline_ratio")) {
    fmt::print(
        "I/O        {:.3f} GB per token at {:.2f} GB/s: roofline {:.3f} tokens/s; achieved "
        "{:.2f} of it\n",
        num("bytes_read_per_token") / 1e9, num("disk_bandwidth_bytes_per_s") / 1e9,
        num("io_roofline_tokens_per_s"), num("io_roofline_ratio"));
  }
  fmt::print("peak RSS   {:.2f} GiB\n", peak_rss_bytes() / 1073741824.0);
}

void run_bench(BenchArgs& a) {
  const bool constrained = !a.gen.grammar_file.empty() || !a.gen.json_schema.empty();
  // The images first: a missing file or a non-image is said before the model loads.
  const std::vector<BenchImage> images = read_bench_images(a.images);
  double mem_bw = 0;
  LoadedEngine engine = load_for_bench(a, constrained, mem_bw);
  if (constrained) {
    const auto c = constraint_for(a.gen, &*engine.tokenizer, false, Channel::response);
    nlohmann::json j = bench_constraint(engine, c, a.gen_tokens, a.reps,
                                        a.constraint_temperature.value_or(1.0f), !a.json);
    j["model"] = a.engine.model;
    if (a.json) fmt::print("{}\n", j.dump());
    return;
  }
  if (a.turns > 0) return run_turns(a, engine);
  const LoadedModel& model = *engine.model;
  // Each repetition holds its prompt and every generated token in one state: check the whole
  // length now rather than after the repetitions that fit.
  const int64_t context = model.plan() ? model.plan()->context : model.config().max_positions;
  if (int64_t{a.prompt_tokens} + a.gen_tokens > context) {
    fail_usage(
        "--prompt-tokens {} + --gen-tokens {} = {} tokens, more than the context of {} positions "
        "(lower them, or raise --ctx up to the model's {})",
        a.prompt_tokens, a.gen_tokens, int64_t{a.prompt_tokens} + a.gen_tokens, context,
        model.config().max_positions);
  }
  const BenchRuns runs =
      run_bench_passes(engine, {a.prompt_tokens, a.gen_tokens, a.reps, a.in_ram_reference});
  // Best of three short probes per drive: its sequential O_DIRECT bandwidth with the store's
  // reader count (the best, so the roofline is not flattered by one slow probe). With homes the
  // disk bandwidth is the sum over the drives (the model folder and each home).
  std::vector<double> drive_bw;
  if (!a.no_disk_probe) drive_bw = probe_drives(*engine.model, a.engine.readers, 512ull << 20, 3);
  nlohmann::json j = bench_figures(a, engine, runs, mem_bw, drive_bw);
  if (!images.empty()) j["vision"] = bench_images(engine, images, a.reps);
  if (!a.report.empty()) {
    write_file_atomic(a.report, bench_report_html(j));
    fmt::print(stderr, "report written to {}\n", a.report);
  }
  if (a.json) {
    fmt::print("{}\n", j.dump());
    return;
  }
  print_figures(j, model, runs, drive_bw);
  if (j.contains("vision")) print_bench_images(j["vision"]);
}
}  // namespace

void register_bench(CLI::App& app) {
  auto [cmd, a] = add_traced_engine_command<BenchArgs>(
      app, "bench", "Measure prefill and decode speed on synthetic token ids, against the roofline",
      run_bench);
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "Prompt length")->capture_default_str();
  cmd->add_option("--prefill-chunk", a->prefill_chunk,
                  "Prompt tokens per forward pass: auto (as many as the memory budget holds) or N")
      ->capture_default_str()
      ->check(auto_or_positive());
  cmd->add_option("--gen-tokens", a->gen_tokens, "Decoded tokens per repetition")
      ->capture_default_str();
  cmd->add_option("--reps", a->reps, "Repetitions (after one warm-up)")->capture_default_str();
  cmd->add_option("--turns", a->turns,
                  "Instead: a conversation of N turns, each adding --prompt-tokens to all before "
                  "it and decoding --gen-tokens; prints each turn's prefill seconds continuing "
                  "from the prefix store and from scratch")
      ->check(CLI::Range(1, 1000));
  add_state_cache_options(cmd, a->state_cache);
  cmd->add_option("--grammar-file", a->gen.grammar_file,
                  "Instead: decode tokens/s with and without this GBNF grammar (temperature 1, "
                  "the same seeds, alternating; up to --gen-tokens per generation)");
  cmd->add_option("--json-schema", a->gen.json_schema,
                  "Instead: the same with this JSON Schema (JSON text or @FILE)");
  cmd->add_option("--temperature", a->constraint_temperature,
                  "With --json-schema or --grammar-file: the temperature of both runs (0 = "
                  "greedy; default 1)")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--image", a->images,
                  "Also measure the vision tower on this image (repeatable; PNG, JPEG, GIF, "
                  "WebP): grid, image tokens, tower seconds per image, the tower's memory");
  cmd->add_flag("--no-disk-probe", a->no_disk_probe, "Skip the disk bandwidth probe");
  cmd->add_flag("!--no-in-ram-reference", a->in_ram_reference,
                "Out of core: skip the in-RAM decode of the same dimensions that the bound uses");
  cmd->add_flag("--json", a->json, "Print one JSON object");
  add_draft_options(cmd, a->draft);
  cmd->add_option("--report", a->report,
                  "Also write the figures as a self-contained HTML file with SVG charts")
      ->check(CLI::Validator(
          [](std::string& path) -> std::string {
            const auto dir = std::filesystem::absolute(path).parent_path();
            if (std::filesystem::is_directory(dir)) return "";
            return "the folder " + dir.string() + " does not exist";
          },
          "FILE.html"));
}

}  // namespace deltafin::cli
