// `deltafin propose`: what a draft model proposes after a committed prefix and an anchor — for
// tests and for people checking a drafter against a reference. It runs exactly the path decoding
// uses: the target prefills the prefix with the drafter's taps attached, then the drafter drafts
// from the anchor. Output: {"draft_ids": [...], "confidence": [...]} (confidence only for
// drafters that have a confidence head; `--draft mtp` is DeepSeek-V3's own MTP layer); --logits-out
// writes the drafter's raw logits, one float32 LE row per draft ([K, vocab]), before any Markov
// bias.
#include <fmt/ranges.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/timer.h"
#include "draft/draft_model.h"
#include "draft/tap_drafter.h"
#include "model/config.h"

namespace deltafin::cli {

namespace {
struct ProposeArgs {
  EngineOptions engine;
  std::string draft;
  std::string tokens;
  int64_t anchor = -1;
  int drafts = 5;
  std::string logits_out;
  bool json = false;
};

void run_propose(ProposeArgs& a) {
  const std::vector<int32_t> ids = parse_id_list(a.tokens, "--tokens");
  if (ids.empty()) fail_arg("--tokens: expected at least one committed token id");
  if (!a.logits_out.empty()) check_output_target(a.logits_out);  // before anything loads
  // The draft is opened first so the target's memory plan counts it.
  a.engine.model = resolve_model_dir(a.engine.model);
  std::error_code ec;
  if (a.draft != "mtp" && !std::filesystem::is_directory(a.draft, ec))
    fail_arg("--draft {}: expected a draft model folder or mtp", a.draft);
  LoadRequest req;
  req.engine = a.engine;
  req.draft = a.draft;
  LoadedEngine loaded = load_engine(std::move(req));
  auto& draft_model = loaded.draft_model;
  auto& model = loaded.model;
  const int64_t vocab = model->config().vocab;
  if (a.anchor < 0 || a.anchor >= vocab)
    fail_arg("--anchor {}: expected a token id in 0..{}", a.anchor, vocab - 1);
  auto drafter = draft_model->new_drafter(*model);
  State state = model->new_state();
  drafter->attach(state);
  Stopwatch sw;
  model->forward(state, ids);
  const double prefill_s = sw.elapsed();
  std::vector<int32_t> history = ids;
  history.push_back(static_cast<int32_t>(a.anchor));
  sw.reset();
  const DraftProposal p = drafter->propose(history, a.drafts);
  const double draft_s = sw.elapsed();
  if (!drafter->fallback_reason().empty()) fail("{}", drafter->fallback_reason());
  if (a.engine.verbose) {
    fmt::print(stderr,
               "propose: target prefill of {} tokens {:.3f} s; draft cache of {} positions "
               "and {} drafts {:.3f} s\n",
               ids.size(), prefill_s, ids.size(), p.tokens.size(), draft_s);
  }
  if (!a.logits_out.empty()) {
    const auto& l = drafter->last_logits();
    write_file_atomic(a.logits_out, std::string_view(reinterpret_cast<const char*>(l.data()),
                                                     l.size() * sizeof(float)));
  }
  if (a.json) {
    nlohmann::json j;
    j["draft_ids"] = p.tokens;
    if (!p.confidence.empty()) j["confidence"] = p.confidence;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("draft ids: {}\n", fmt::join(p.tokens, ","));
    if (!p.confidence.empty()) fmt::print("confidence: {}\n", fmt::join(p.confidence, ","));
  }
}
}  // namespace

void register_propose(CLI::App& app) {
  auto args = std::make_shared<ProposeArgs>();
  auto* cmd = app.add_subcommand(
      "propose", "Print a draft model's proposal for a committed prefix and an anchor token");
  add_engine_options(cmd, args->engine);
  cmd->add_option("--draft", args->draft,
                  "Draft model folder (EAGLE-3/3.1 or DSpark: config.json + model.safetensors), "
                  "or mtp (DeepSeek-V3's own MTP layer)")
      ->required()
      ->check(CLI::IsMember({"mtp"}) | CLI::ExistingDirectory);
  cmd->add_option("--tokens", args->tokens, "Committed token ids, e.g. 5,17,200")->required();
  cmd->add_option("--anchor", args->anchor,
                  "The token the target chose after --tokens (not yet run through it)")
      ->required();
  cmd->add_option("--drafts", args->drafts, "Drafts to propose (K)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--logits-out", args->logits_out,
                  "Write the drafter's logits [K, vocab] (float32 LE, before any Markov bias)");
  cmd->add_flag("--json", args->json, "Print {\"draft_ids\": [...], \"confidence\": [...]}");
  cmd->callback([args] { run_propose(*args); });
}

}  // namespace deltafin::cli
