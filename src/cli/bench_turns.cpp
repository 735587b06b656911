// `deltafin bench --turns N`: a conversation of N turns on synthetic token ids, each turn adding
// --prompt-tokens new tokens to everything before it and decoding --gen-tokens (greedy, with the
// drafter when there is one). Each turn is prefilled twice in one run: continuing from the prefix
// store (prefix/reuse.h: the snapshot the previous turn kept when it ended) and from scratch
// (the whole conversation), so the two prefill times are comparable as a ratio. With
// --state-cache-ram 0 every restore reads its snapshot from disk.
#include "cli/bench_turns.h"

#include <fmt/format.h>

#include "cli/bench_prompt.h"
#include "core/sysinfo.h"
#include "core/timer.h"
#include "generate/driver.h"
#include "runtime/sequence.h"

namespace deltafin::cli {

nlohmann::json bench_turns(LoadedEngine& engine, int turns, int prompt_tokens, int gen_tokens,
                           bool text) {
  LoadedModel& model = *engine.model;
  const ModelConfig& c = model.config();
  const int64_t V = c.vocab;
  const auto chunk = static_cast<size_t>(std::max<int64_t>(1, model.pass_plan().pass_rows));
  SyntheticIds ids(V, 0x9E3779B97F4A7C15ull);
  std::vector<int32_t> conversation;
  std::unique_ptr<Drafter> drafter;
  DraftConfig draft = engine.draft_config(drafter);
  nlohmann::json rows = nlohmann::json::array();
  if (text) {
    fmt::print(
        "turn  conversation  prefilled  restored  from  prefill_s(reuse)  of which restore  "
        "prefill_s(full)  full/reuse  drafts(proposed/accepted)\n");
  }
  for (int t = 1; t <= turns; ++t) {
    for (int i = 0; i < prompt_tokens; ++i) conversation.push_back(ids.next());
    // With reuse: the deepest kept snapshot, then the rest, then the answer.
    GenerationParams gp;
    gp.max_new_tokens = gen_tokens;
    gp.prefill_chunk = static_cast<int64_t>(chunk);
    gp.context_limit = model.plan() ? model.plan()->context : c.max_positions;
    draft.stats = DraftStats{};
    Sequence seq(model, nullptr, engine.store.get(), {conversation, {}, gp, {}},
                 SequenceDrafter(draft));
    const int64_t restored = seq.cached();
    const auto prefilled = static_cast<int64_t>(seq.input().size());
    seq.drive(nullptr, nullptr);
    const Generation& g = seq.gen();
    // The restore is part of what reuse costs.
    const double with_reuse = seq.restored().seconds + g.timing().prefill_done - g.timing().start;
    seq.finish();
    // From scratch: the same prompt in passes of the plan's rows.
    State fresh = model.new_state();
    Stopwatch sw;
    prefill_in_passes(model, fresh, conversation, chunk);
    const double full = sw.elapsed();
    const Restored& r = seq.restored();
    nlohmann::json row = {{"turn", t},
                          {"conversation_tokens", conversation.size()},
                          {"prefilled_tokens", prefilled},
                          {"restored_tokens", restored},
                          {"restored_from", restored > 0 ? r.where() : ""},
                          {"restore_s", r.seconds},
                          {"prefill_s_reuse", with_reuse},
                          {"prefill_s_full", full},
                          {"full_over_reuse", with_reuse > 0 ? full / with_reuse : 0.0},
                          {"draft_proposed", draft.stats.proposed},
                          {"draft_accepted", draft.stats.accepted}};
    if (text) {
      fmt::print(
          "{:>4}  {:>12}  {:>9}  {:>8}  {:>4}  {:>16.4f}  {:>16.4f}  {:>15.4f}  {:>10.2f}  {}/{}\n",
          t, conversation.size(), prefilled, restored, row["restored_from"].get<std::string>(),
          with_reuse, r.seconds, full, row["full_over_reuse"].get<double>(), draft.stats.proposed,
          draft.stats.accepted);
    }
    rows.push_back(std::move(row));
    const std::vector<int32_t> answer = g.completion_ids();
    conversation.insert(conversation.end(), answer.begin(), answer.end());
  }
  if (text) fmt::print("peak RSS   {:.2f} GiB\n", peak_rss_bytes() / 1073741824.0);
  return rows;
}

}  // namespace deltafin::cli
