// `deltafin bench --json-schema X` / `--grammar-file F`: decode tokens per second with and
// without the constraint, in one run. Each repetition generates twice from the same prompt (a
// short English text the model's tokenizer encodes) with the same seed at --temperature (1 by
// default; at 0 both runs are greedy, so neither pays for ordering candidates), up to
// --gen-tokens: once free, once under the constraint (which ends when its grammar does); the
// order alternates between repetitions so a drift in the machine's load favours neither. Both
// go through the same Generation and drafting round as `run` (the model's drafter, if any), so
// the difference is what the constraint costs: the mask per sampled token, the draft cut, and
// the tokens it changes. Decode speed excludes the prefill and the first token, as `run
// --stats` reports it. Figures only; no assertions.
#include "cli/bench_constraint.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/sysinfo.h"
#include "generate/driver.h"

namespace deltafin::cli {

namespace {

struct Run {
  double tokens_per_s = 0;
  int64_t tokens = 0;
  double mask_us_per_token = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

nlohmann::json bench_constraint(LoadedEngine& engine,
                                const std::shared_ptr<const grammar::Constraint>& constraint,
                                int gen_tokens, int reps, float temperature, bool text) {
  LoadedModel& model = *engine.model;
  if (!engine.tokenizer) fail_arg("bench with a constraint needs the model's tokenizer");
  const Tokenizer& tok = *engine.tokenizer;
  const std::vector<int32_t> prompt = tok.encode_ordinary("Here is the record, as JSON:\n");
  std::unique_ptr<Drafter> drafter;
  DraftConfig draft = engine.draft_config(drafter);
  const int64_t context = model.plan() ? model.plan()->context : model.config().max_positions;
  auto one = [&](bool constrained, uint64_t seed) {
    GenerationParams gp;
    gp.max_new_tokens = gen_tokens;
    gp.prefill_chunk = std::max<int64_t>(1, model.pass_plan().pass_rows);
    gp.context_limit = context;
    gp.sampling.temperature = temperature;
    gp.sampling.has_seed = true;
    gp.sampling.seed = seed;
    gp.top_logprobs = -1;
    if (constrained) gp.constraint = constraint;
    Generation g(prompt, gp, &tok, model.config().vocab);
    State st = model.new_state();
    draft.stats = DraftStats{};
    drive(model, st, g, nullptr, nullptr, &draft);
    const GenerationTiming& t = g.timing();
    Run r;
    r.tokens = static_cast<int64_t>(g.tokens().size());
    const double span = t.last_token - t.first_token;
    r.tokens_per_s = r.tokens > 1 && span > 0 ? static_cast<double>(r.tokens - 1) / span : 0;
    r.mask_us_per_token = r.tokens > 0 ? t.mask_s * 1e6 / static_cast<double>(r.tokens) : 0;
    return r;
  };
  one(false, 1);  // warm-up: page in the weights, compute the grammar's masks once
  one(true, 1);
  std::vector<double> free_tps, held_tps, mask_us;
  int64_t free_tokens = 0, held_tokens = 0;
  for (int rep = 0; rep < reps; ++rep) {
    const uint64_t seed = static_cast<uint64_t>(rep) + 2;
    for (int k = 0; k < 2; ++k) {
      const bool constrained = (k == 0) == (rep % 2 == 1);
      const Run r = one(constrained, seed);
      (constrained ? held_tps : free_tps).push_back(r.tokens_per_s);
      (constrained ? held_tokens : free_tokens) += r.tokens;
      if (constrained) mask_us.push_back(r.mask_us_per_token);
    }
  }
  const double f = median(free_tps), h = median(held_tps);
  nlohmann::json j = {{"cpu", cpu_model_name()},
                      {"constraint", constraint->description},
                      {"draft", engine.draft},
                      {"reps", reps},
                      {"temperature", temperature},
                      {"decode_tokens_per_s", f},
                      {"decode_tokens_per_s_reps", free_tps},
                      {"constrained_decode_tokens_per_s", h},
                      {"constrained_decode_tokens_per_s_reps", held_tps},
                      {"constrained_over_free", f > 0 ? h / f : 0.0},
                      {"tokens", free_tokens},
                      {"constrained_tokens", held_tokens},
                      {"mask_us_per_token", median(mask_us)}};
  if (text) {
    fmt::print("machine      {}\n", cpu_model_name());
    fmt::print("free         {:.2f} tokens/s median over {} reps ({} tokens)\n", f, reps,
               free_tokens);
    fmt::print("constrained  {:.2f} tokens/s median over {} reps ({} tokens; {}), {:.2f}x free\n",
               h, reps, held_tokens, constraint->description, f > 0 ? h / f : 0.0);
    fmt::print("mask         {:.1f} us per sampled token (median of the reps), drafter {}\n",
               median(mask_us), engine.draft);
  }
  return j;
}

}  // namespace deltafin::cli
