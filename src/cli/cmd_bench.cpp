// `deltafin bench`: prefill and decode speed on synthetic token ids, with warm-up and
// repetitions (median, min, max), next to what bounds it: the weight bytes a decoded token
// streams and the machine's memory bandwidth (its own probe). Figures only; no assertions.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/sysinfo.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "model/model.h"

namespace deltafin::cli {

namespace {
struct BenchArgs {
  EngineOptions engine;
  int prompt_tokens = 64;
  int gen_tokens = 16;
  int reps = 3;
  bool json = false;
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

int32_t argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

void run_bench(const BenchArgs& a) {
  if (a.prompt_tokens < 1 || a.gen_tokens < 1 || a.reps < 1) {
    fail_arg("--prompt-tokens, --gen-tokens and --reps must be at least 1");
  }
  auto model = load_model(a.engine);
  const ModelConfig& c = model->config();
  // Deterministic pseudo-random prompt over the ordinary (non-special) ids.
  const int64_t ordinary = std::max<int64_t>(1, c.vocab > 512 ? c.vocab - 256 : c.vocab);
  std::vector<int32_t> prompt(static_cast<size_t>(a.prompt_tokens));
  uint64_t x = 88172645463325252ull;
  for (auto& t : prompt) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t = static_cast<int32_t>(x % static_cast<uint64_t>(ordinary));
  }
  const int64_t V = c.vocab;
  auto one_run = [&](int gen, double& prefill_s, double& decode_s, int64_t& fetches, int64_t& passes) {
    State st = model->new_state();
    Stopwatch sw;
    auto logits = model->forward(st, prompt);
    prefill_s = sw.elapsed();
    int32_t next = argmax(logits.data(), V);
    const int64_t f0 = model->pass_stats().expert_fetches, p0 = model->pass_stats().passes;
    sw.reset();
    for (int i = 0; i < gen; ++i) {
      auto l = model->forward(st, std::span<const int32_t>(&next, 1));
      next = argmax(l.data(), V);
    }
    decode_s = sw.elapsed();
    fetches = model->pass_stats().expert_fetches - f0;
    passes = model->pass_stats().passes - p0;
  };
  {  // warm-up: page in the weights, spin up the threads
    double p, d;
    int64_t f, n;
    one_run(std::min(a.gen_tokens, 2), p, d, f, n);
  }
  std::vector<double> prefill_tps, decode_tps;
  int64_t fetches = 0, passes = 0;
  for (int r = 0; r < a.reps; ++r) {
    double p, d;
    int64_t f, n;
    one_run(a.gen_tokens, p, d, f, n);
    prefill_tps.push_back(a.prompt_tokens / p);
    decode_tps.push_back(a.gen_tokens / d);
    fetches += f;
    passes += n;
  }
  const double experts_per_pass = passes > 0 ? static_cast<double>(fetches) / passes : 0;
  const double bytes_per_token = static_cast<double>(model->trunk_bytes_per_pass()) +
                                 experts_per_pass * static_cast<double>(model->expert_bytes());
  const int threads = global_pool().size();
  const double mem_bw = measure_memory_bandwidth(threads);
  Summary ps = summarize(prefill_tps), ds = summarize(decode_tps);
  const double eff_bw = bytes_per_token * ds.median;

  if (a.json) {
    nlohmann::json j;
    j["model"] = a.engine.model;
    j["threads"] = threads;
    j["kernels"] = kernels::active().name;
    j["cpu"] = cpu_model_name();
    j["prompt_tokens"] = a.prompt_tokens;
    j["gen_tokens"] = a.gen_tokens;
    j["reps"] = a.reps;
    j["prefill_tokens_per_s"] = ps.median;
    j["prefill_tokens_per_s_min"] = ps.min;
    j["prefill_tokens_per_s_max"] = ps.max;
    j["decode_tokens_per_s"] = ds.median;
    j["decode_tokens_per_s_min"] = ds.min;
    j["decode_tokens_per_s_max"] = ds.max;
    j["s_per_token"] = ds.median > 0 ? 1.0 / ds.median : 0.0;
    j["decode_weight_bytes_per_token"] = bytes_per_token;
    j["decode_experts_per_token"] = experts_per_pass;
    j["effective_weight_bandwidth_bytes_per_s"] = eff_bw;
    j["memory_bandwidth_bytes_per_s"] = mem_bw;
    j["peak_rss_bytes"] = peak_rss_bytes();
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("model      {} ({} layers, hidden {}, {} experts top-{}, vocab {})\n", a.engine.model,
             c.num_layers, c.hidden, c.moe.num_experts, c.moe.top_k, c.vocab);
  fmt::print("machine    {}, {} threads, kernels {}\n", cpu_model_name(), threads, kernels::active().name);
  fmt::print("prefill    {:.2f} tokens/s median (min {:.2f}, max {:.2f}) over {} reps of {} tokens\n",
             ps.median, ps.min, ps.max, a.reps, a.prompt_tokens);
  fmt::print("decode     {:.2f} tokens/s median (min {:.2f}, max {:.2f}), {:.4f} s/token, {} tokens per rep\n",
             ds.median, ds.min, ds.max, ds.median > 0 ? 1.0 / ds.median : 0.0, a.gen_tokens);
  fmt::print("weights    {} per decoded token ({:.1f} experts), {:.2f} GB/s effective\n",
             human_bytes(bytes_per_token), experts_per_pass, eff_bw / 1e9);
  fmt::print("memory     {:.2f} GB/s measured read bandwidth ({:.0f}% used by decode)\n", mem_bw / 1e9,
             mem_bw > 0 ? 100.0 * eff_bw / mem_bw : 0.0);
  fmt::print("peak RSS   {}\n", human_bytes(static_cast<double>(peak_rss_bytes())));
}
}  // namespace

void register_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand("bench", "Measure prefill and decode speed on synthetic token ids");
  add_engine_options(cmd, a->engine);
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "Prompt length")->capture_default_str();
  cmd->add_option("--gen-tokens", a->gen_tokens, "Decoded tokens per repetition")->capture_default_str();
  cmd->add_option("--reps", a->reps, "Repetitions (after one warm-up)")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->callback([a] { run_bench(*a); });
}

}  // namespace deltafin::cli
