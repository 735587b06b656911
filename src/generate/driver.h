// Running generations against a model: the single-sequence loop the CLI uses, and the stats a
// finished generation reports (what `run --stats` / `--json` print).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "generate/generation.h"
#include "generate/speculative.h"
#include "model/experts.h"
#include "model/model.h"

namespace deltafin {

// Drafting for drive(): decode passes verify up to `max` drafts of `drafter`.
struct DraftConfig {
  Drafter* drafter = nullptr;
  int max = 8;
  DraftStats stats;  // accumulated over the passes driven
};

// Feeds the generation pass by pass until it finishes or `cancel` becomes true, calling
// `on_step` after every pass (events are waiting in the generation). A failing pass aborts the
// generation and rethrows. With `draft`, each decode pass is a deferred pass over
// [last token, drafts]; the generation samples row by row exactly as it would from plain
// passes (same logits, same sampler draws) and a draft is accepted while it equals the sampled
// token, so output and seeded sampling are unchanged; the state is committed by the rows the
// generation consumed.
void drive(Model& model, State& state, Generation& gen, const std::atomic<bool>* cancel,
           const std::function<void(Generation&)>& on_step, DraftConfig* draft = nullptr);

struct RunStats {
  int64_t prompt_tokens = 0;  // tokens prefilled in this run
  int64_t reused_tokens = 0;  // prompt tokens served from kept state (chat turns)
  int64_t completion_tokens = 0;
  double prefill_s = 0, ttft_s = 0, decode_s = 0;
  double decode_tokens_per_s = 0, s_per_token = 0, prefill_tokens_per_s = 0;
  int64_t draft_proposed = 0, draft_accepted = 0;
  ExpertStats experts;         // deltas over the run
  TrunkStats trunk;            // deltas over the run (streamed trunk bytes, waits)
  double prefetch_recall = 0;  // predicted / requested experts over the run (0 without prediction)
  double elapsed_s = 0;        // the whole generation
  int64_t passes = 0;
  uint64_t peak_rss_bytes = 0;
  std::string stop_reason;
  uint64_t seed = 0;

  double gb_per_token() const;
  // Adds the fields above to `j` (the run --json schema).
  void to_json(nlohmann::json& j) const;
  std::string summary() const;  // the human `--stats` block
};

// The object `deltafin run --json` prints (and the C API's generation result): model, prompt
// and completion ids, text (with `chat`: reasoning and tool calls), then the stats fields.
nlohmann::json run_json(const std::string& model, std::span<const int32_t> prompt,
                        const Generation& gen, const RunStats& stats, bool chat);

// Snapshot counters before a run; finish() fills a RunStats from the generation and the deltas.
class StatsRecorder {
 public:
  explicit StatsRecorder(Model& model);
  RunStats finish(const Generation& gen) const;

 private:
  Model& model_;
  ExpertStats experts0_;
  PassStats passes0_;
  TrunkStats trunk0_;
  std::vector<LayerRecall> recall0_;
};

}  // namespace deltafin
