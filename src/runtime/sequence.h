// One generation's life, owned in one place: its Generation, its drafter and drafting state, its
// constraint and logit bias, its state (its own, or a conversation's kept one), the reuse of kept
// prefix snapshots (restore before the prompt, cut points, a snapshot after each pass that
// reaches one and at the end), the ids the state consumed, and its usage and timings. The
// server's scheduler runs many in one round (round_entry / after_pass), the C API's stream steps
// one pass at a time (step), `chat` and `bench --turns` drive one to its end (drive); each then
// calls finish. So what a sequence is — and how reuse, drafting and usage are wired — is written
// once (docs/ARCHITECTURE.md, "Sequences").
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "generate/driver.h"
#include "generate/generation.h"
#include "generate/round.h"
#include "model/model.h"
#include "prefix/reuse.h"
#include "runtime/images.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace deltafin {

// Wall-clock points of one sequence (now_seconds() clock; 0 = not reached), for the server's
// llama.cpp-style `timings` object.
struct Timings {
  double arrived = 0;      // the request was accepted (by the HTTP thread, or the call)
  double admitted = 0;     // the sequence started (prefill starts)
  double first_token = 0;  // the first completion token was sampled
  double finished = 0;     // the generation ended
  // Speculative decoding: drafts verified and accepted, decode passes and the tokens they
  // emitted; reported only when drafting.
  bool drafting = false;
  int64_t draft_n = 0, draft_n_accepted = 0, target_passes = 0, decode_tokens = 0;
};

struct Usage {
  int64_t prompt_tokens = 0;  // positions the prompt occupies (cached included)
  int64_t cached_tokens = 0;  // of those, continued from a kept snapshot (never prefilled)
  int64_t completion_tokens = 0;
  Timings timings;
  std::string cached_from;   // "RAM" or "disk" when a snapshot was restored
  double cached_load_s = 0;  // restoring that snapshot
  // The generation hit max_tokens (or the context) before its grammar or schema was complete:
  // the response says so in `warning`, since the output will not parse.
  bool constraint_unfinished = false;
  // Ended (cancelled, timed out) before its prompt was all prefilled: the prompt positions the
  // state held by then, cached included (the server's log line says so).
  bool stopped_in_prefill = false;
  int64_t prompt_prefilled = 0;
  // The prompt's images (image_stats()): how many, how many the tower encoded (the rest were in
  // the kept state) and its seconds on them (the server's log line says so).
  int64_t images = 0, images_encoded = 0;
  double vision_s = 0;
};

// What a front end asks a sequence to do.
struct SequenceSpec {
  // Every id the state must have consumed before the first sampled token: a prompt, or a
  // conversation's history with its new turn. A kept state holds a prefix of them.
  std::vector<int32_t> ids;
  PromptMarks marks;  // where the reuse policy snapshots (prefix/reuse.h)
  GenerationParams params;
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to each logit row before sampling
  double arrived = 0;                                 // when it was asked (0: when it starts)
  // The prompt's images (RenderedPrompt::images, positions in `ids`) and the encoder that turns
  // them into the rows of their <|media_pad|> positions (the loaded engine's; null: the model
  // has no tower, and an image is refused). The prefix store keys the images' segments by their
  // hashes (state_key_ids), and only images past the restored or kept prefix are encoded.
  std::vector<PromptImage> images;
  const VisionEncoder* vision = nullptr;
};

// A sequence's drafter: none, its own (a server slot, a C API stream), or the one a conversation
// keeps from turn to turn (chat, bench --turns), whose acceptance estimate and measured pass
// costs carry over.
class SequenceDrafter {
 public:
  SequenceDrafter() = default;
  SequenceDrafter(std::unique_ptr<Drafter> own, const DraftMax& max);
  explicit SequenceDrafter(DraftConfig& kept) : kept_(&kept) {}

 private:
  friend class Sequence;
  std::unique_ptr<Drafter> own_;
  DraftConfig own_config_;
  DraftConfig* kept_ = nullptr;
};

class Sequence {
 public:
  // Restores the deepest kept snapshot of spec.ids into the state (the store may be null: no
  // reuse) unless `kept_state` already holds a prefix of them, and sets up the generation of
  // the rest. `kept_state` null: the sequence has a state of its own. `record_stats`: keep the
  // model's counters at the start, for run_stats(). Throws InvalidArgument for a bad request,
  // std::bad_alloc when the state does not fit. The caller serialises it with the model's
  // passes (a restore computes with the drafter).
  Sequence(Model& model, const Tokenizer* tok, PrefixStore* store, SequenceSpec spec,
           SequenceDrafter drafter, State* kept_state = nullptr, bool record_stats = false);
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  Generation& gen() { return *gen_; }
  const Generation& gen() const { return *gen_; }
  State& state() { return *state_; }
  DraftConfig& draft() { return *draft_; }
  Drafter* drafter() const { return draft_->drafter; }
  // Positions the state held before the generation's first pass (restored or kept).
  int64_t cached() const { return cached_; }
  // The ids the generation was fed (the spec's ids after the cached ones).
  std::span<const int32_t> input() const {
    return std::span<const int32_t>(spec_.ids).subspan(static_cast<size_t>(cached_));
  }
  const Restored& restored() const { return reuse_.restored(); }
  const Timings& timings() const { return timings_; }

  // This sequence's entry in a round (generate/round.h); `extra` edits each logit row after
  // the logit bias (the server's test script). Call after_pass() once the round ran.
  RoundSequence round_entry(std::function<void(const Generation&, std::span<float>)> extra = {});
  // After a pass that held its rows: a snapshot where the reuse policy keeps one.
  void after_pass();
  // One pass of its own (a prompt chunk, a decode or a verify pass), then after_pass.
  void step();
  // Passes until the generation finishes or `cancel` becomes true; `on_step` after every pass.
  void drive(const std::atomic<bool>* cancel, const std::function<void(Generation&)>& on_step);
  // The generation ended: the state after the answer is kept for a client that sends it back
  // (not when cancelled). `consumed`: every id the state consumed (default: the spec's ids and
  // the completion the state consumed).
  void finish(std::optional<std::span<const int32_t>> consumed = std::nullopt);

  // The counts and times of the sequence so far (the server's and the C API's usage).
  Usage usage() const;
  // What `run --stats` / `--json` report (record_stats must have been set).
  RunStats run_stats() const;
  // The prompt's images as the constructor encoded them (zeros without images).
  const ImageEncodeStats& image_stats() const { return image_stats_; }

 private:
  Model& model_;
  SequenceSpec spec_;
  std::vector<int32_t> key_;  // spec_.ids as the prefix store keys them (images by hash)
  SequenceDrafter drafting_;
  DraftConfig* draft_;
  State own_state_;
  State* state_;
  SequenceReuse reuse_;
  int64_t cached_;
  std::unique_ptr<Generation> gen_;
  std::optional<StatsRecorder> recorder_;
  Timings timings_;
  PositionRows image_rows_;  // the images' rows at their pad positions past cached_
  ImageEncodeStats image_stats_;
};

}  // namespace deltafin
