// `deltafin perplexity`: perplexity of a text under the model, and with --trunk int8 what the
// lossy trunk costs against the exact path: both perplexities, the mean KL divergence of the
// next-token distributions, top-1 agreement and logit distances. The exact run's logits go to
// a temporary file, so only one model is in memory at a time.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace deltafin::cli {

namespace {
struct PplArgs {
  EngineOptions engine;
  std::string file;
  int64_t window = 512;
  int64_t max_tokens = 2048;
  bool json = false;
};

struct Windowed {
  std::vector<std::pair<size_t, size_t>> windows;  // [begin, end) of the token list
};

// Runs every window from a fresh state; calls f(window, logits[T][V]).
template <typename F>
void for_each_window(Model& m, const std::vector<int32_t>& ids, const Windowed& w, F&& f) {
  for (size_t i = 0; i < w.windows.size(); ++i) {
    auto [b, e] = w.windows[i];
    State st = m.new_state();
    auto logits =
        m.forward(st, std::span<const int32_t>(ids.data() + b, e - b), /*all_logits=*/true);
    f(i, logits);
  }
}

std::vector<double> log_softmax(const float* x, int64_t n) {
  double mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - mx);
  const double lse = mx + std::log(s);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] - lse;
  return out;
}

void run_perplexity(PplArgs& a) {
  if (a.window < 2) fail_arg("--window must be at least 2");
  a.engine.model = resolve_model_dir(a.engine.model);
  require_tokenizer(a.engine.model, "perplexity");
  Tokenizer tok = Tokenizer::load(a.engine.model);
  std::vector<int32_t> ids = tok.encode_ordinary(read_file(a.file));
  if (static_cast<int64_t>(ids.size()) > a.max_tokens)
    ids.resize(static_cast<size_t>(a.max_tokens));
  if (ids.size() < 2) fail_arg("{} has fewer than 2 tokens", a.file);
  Windowed w;
  for (size_t b = 0; b + 1 < ids.size(); b += static_cast<size_t>(a.window)) {
    w.windows.push_back({b, std::min(ids.size(), b + static_cast<size_t>(a.window))});
  }
  if (w.windows.size() > 1 && w.windows.back().second - w.windows.back().first < 2)
    w.windows.pop_back();
  PlanShape shape;  // passes of a whole window
  shape.max_rows = std::max(shape.max_rows, a.window);
  const bool compare = a.engine.trunk == TrunkFormat::kInt8;
  const TrunkFormat lossy_trunk = a.engine.trunk;

  // Exact pass (BF16 trunk), logits kept on disk when a comparison follows.
  a.engine.trunk = TrunkFormat::kBF16;
  double nll_exact = 0;
  int64_t scored = 0, V = 0;
  std::string tmp =
      std::filesystem::temp_directory_path() / fmt::format("deltafin-ppl-{}.f32", ::getpid());
  {
    auto m = load_model(a.engine, shape);
    V = m->config().vocab;
    std::ofstream out;
    if (compare) out.open(tmp, std::ios::binary);
    for_each_window(*m, ids, w, [&](size_t i, const std::vector<float>& lg) {
      auto [b, e] = w.windows[i];
      for (size_t t = 0; t + 1 < e - b; ++t) {
        auto ls = log_softmax(lg.data() + t * V, V);
        nll_exact -= ls[static_cast<size_t>(ids[b + t + 1])];
        ++scored;
      }
      if (compare)
        out.write(reinterpret_cast<const char*>(lg.data()),
                  static_cast<std::streamsize>(lg.size() * 4));
    });
  }
  nlohmann::json j;
  j["tokens"] = ids.size();
  j["scored_tokens"] = scored;
  j["windows"] = w.windows.size();
  j["perplexity"] = std::exp(nll_exact / scored);
  if (compare) {
    a.engine.trunk = lossy_trunk;
    auto m = load_model(a.engine, shape);
    std::ifstream in(tmp, std::ios::binary);
    double nll = 0, kl = 0, max_abs = 0, sum_abs = 0;
    int64_t agree = 0, rows = 0;
    std::vector<float> ref;
    for_each_window(*m, ids, w, [&](size_t i, const std::vector<float>& lg) {
      auto [b, e] = w.windows[i];
      ref.resize(lg.size());
      in.read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * 4));
      for (size_t t = 0; t < e - b; ++t) {
        const float* p = ref.data() + t * V;
        const float* q = lg.data() + t * V;
        auto lp = log_softmax(p, V), lq = log_softmax(q, V);
        double k = 0;
        for (int64_t v = 0; v < V; ++v) {
          k += std::exp(lp[v]) * (lp[v] - lq[v]);
          const double d = std::fabs(static_cast<double>(p[v]) - q[v]);
          max_abs = std::max(max_abs, d);
          sum_abs += d;
        }
        kl += k;
        agree += (std::max_element(p, p + V) - p) == (std::max_element(q, q + V) - q);
        ++rows;
        if (t + 1 < e - b) nll -= lq[static_cast<size_t>(ids[b + t + 1])];
      }
    });
    std::remove(tmp.c_str());
    j["trunk"] = trunk_format_name(lossy_trunk);
    j["perplexity_lossy"] = std::exp(nll / scored);
    j["perplexity_delta"] = std::exp(nll / scored) - std::exp(nll_exact / scored);
    j["perplexity_delta_percent"] = 100.0 * (std::exp((nll - nll_exact) / scored) - 1.0);
    j["mean_kl"] = kl / static_cast<double>(rows);
    j["top1_agreement"] = static_cast<double>(agree) / static_cast<double>(rows);
    j["max_abs_logit_diff"] = max_abs;
    j["mean_abs_logit_diff"] = sum_abs / (static_cast<double>(rows) * static_cast<double>(V));
  }
  if (a.json) {
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("perplexity {:.4f} over {} tokens ({} windows of up to {}), exact BF16 trunk\n",
             j["perplexity"].get<double>(), scored, w.windows.size(), a.window);
  if (compare) {
    fmt::print(
        "lossy      --trunk {}: perplexity {:.4f} ({:+.4f}, {:+.3f}%), mean KL {:.3g} nats, top-1 "
        "agreement "
        "{:.2f}%, logit |diff| max {:.4g} mean {:.4g}\n",
        trunk_format_name(lossy_trunk), j["perplexity_lossy"].get<double>(),
        j["perplexity_delta"].get<double>(), j["perplexity_delta_percent"].get<double>(),
        j["mean_kl"].get<double>(), 100.0 * j["top1_agreement"].get<double>(),
        j["max_abs_logit_diff"].get<double>(), j["mean_abs_logit_diff"].get<double>());
  }
}
}  // namespace

void register_perplexity(CLI::App& app) {
  auto a = std::make_shared<PplArgs>();
  auto* cmd =
      app.add_subcommand("perplexity",
                         "Perplexity of a text; with --trunk int8, the cost of the lossy trunk "
                         "against the exact path");
  add_engine_options(cmd, a->engine);
  cmd->add_option("--file", a->file, "Text file to score")->required();
  cmd->add_option("--window", a->window,
                  "Tokens per window (each window starts from an empty state)")
      ->capture_default_str();
  cmd->add_option("--max-tokens", a->max_tokens, "Score at most this many tokens of the file")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->callback([a] { run_perplexity(*a); });
}

}  // namespace deltafin::cli
