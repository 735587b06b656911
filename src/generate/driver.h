// Running generations against a model: the single-sequence loop the CLI uses, and the stats a
// finished generation reports (what `run --stats` / `--json` print).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "generate/draft_length.h"
#include "generate/generation.h"
#include "generate/round.h"
#include "generate/speculative.h"
#include "model/experts.h"
#include "model/model.h"

namespace deltafin {

// One line for -v: the verify widths chosen, the acceptance estimate and the measured pass
// costs they were chosen from.
std::string describe_draft_choice(const DraftConfig& c);

// Trunk and expert bytes the model has read so far (the numerator of bytes per token).
uint64_t bytes_read_so_far(Model& model);

// Feeds the generation pass by pass until it finishes or `cancel` becomes true, calling
// `on_step` after every pass (events are waiting in the generation). A failing pass aborts the
// generation and rethrows. With `draft`, each decode pass is a deferred pass over
// [last token, drafts]; the generation samples row by row exactly as it would from plain
// passes (same logits, same sampler draws) and a draft is accepted while it equals the sampled
// token, so output and seeded sampling are unchanged; the state is committed by the rows the
// generation consumed.
// What the sequence is besides its generation: the ids the state consumed before the
// generation's prompt (a kept conversation), so a drafter proposes from the whole sequence, and
// the positions at which prefill passes end for a snapshot (RoundSequence::cut_at).
struct SequenceContext {
  std::span<const int32_t> before;
  std::span<const int64_t> cuts;
};
void drive(Model& model, State& state, Generation& gen, const std::atomic<bool>* cancel,
           const std::function<void(Generation&)>& on_step, DraftConfig* draft = nullptr,
           const SequenceContext& seq = {});
// One pass of drive(): a prompt chunk, a plain decode pass, or (with a drafter) a verify pass;
// `adjust` edits each logit row before sampling (the C API's logit_bias). For callers that
// must lock around each pass (the C API).
void drive_step(Model& model, State& state, Generation& gen, DraftConfig* draft,
                const std::function<void(std::span<float>)>& adjust = {},
                const SequenceContext& seq = {});

struct RunStats {
  int64_t prompt_tokens = 0;  // tokens prefilled in this run
  int64_t reused_tokens = 0;  // prompt tokens served from kept state (chat turns)
  std::string reused_from;    // "RAM" or "disk" when a prefix snapshot was restored
  double reuse_load_s = 0;
  int64_t completion_tokens = 0;
  double prefill_s = 0, ttft_s = 0, decode_s = 0;
  double decode_tokens_per_s = 0, s_per_token = 0, prefill_tokens_per_s = 0;
  DraftStats draft;            // decode passes: drafts, target passes, tokens, bytes read
  ExpertStats experts;         // deltas over the run
  TrunkStats trunk;            // deltas over the run (streamed trunk bytes, waits)
  double prefetch_recall = 0;  // predicted / requested experts over the run (0 without prediction)
  double elapsed_s = 0;        // the whole generation
  int64_t passes = 0;
  uint64_t peak_rss_bytes = 0;
  std::string stop_reason;
  uint64_t seed = 0;
  // Images (docs/VISION.md): those in the prompt, the <|media_pad|> tokens they take, and those
  // the vision tower encoded in this run (an image in a kept prefix is not encoded again) with
  // the time that took (decoding, preprocessing, tower and projector).
  int64_t images = 0, image_tokens = 0, images_encoded = 0;
  double vision_s = 0;

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
