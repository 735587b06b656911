// What EAGLE-3 and DSpark share as drafters of a K3 target: a tap recorder attached to the
// sequence's State (model/taps.h), so the target's prefill and verify passes hand over the
// committed rows' vectors; and the rule that a drafter failing mid-run (a bug, an allocation
// failure, taps that were never recorded for a reused prefix) costs only speed: the sequence
// falls back to plain decoding, the drafter says so once on stderr, and output is unchanged
// because verification never depended on the drafts. Each sequence has its own drafter.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "generate/speculative.h"
#include "model/model.h"
#include "model/taps.h"

namespace deltafin {

class TapDrafter : public Drafter {
 public:
  // `state_id`: what the draft cache rows mean (the draft model's kind, shape and weights).
  TapDrafter(Model& target, TapSpec spec, std::string name, std::string state_id);
  void attach(State& state) override;
  DraftProposal propose(std::span<const int32_t> history, int max_tokens) final;

  bool keeps_state() const override { return true; }
  std::optional<DraftRows> save(std::span<const int32_t> committed, int64_t from) override;
  void restore(State& state, std::span<const int32_t> committed, const DraftRows* rows) override;
  std::string state_id() const override { return state_id_; }

  // The raw logits [k][vocab] of the last proposal (before any Markov bias): `propose
  // --logits-out`.
  const std::vector<float>& last_logits() const { return last_logits_; }
  // Why drafting stopped for this sequence ("" while it runs).
  const std::string& fallback_reason() const { return why_; }

 protected:
  // Forget every draft-cache row (a new sequence).
  virtual void reset() = 0;
  // `history` = committed tokens x_0 .. x_{L-1} then the anchor x_L; taps() holds the committed
  // rows the drafter has not consumed yet, ending at position L.
  virtual DraftProposal draft(std::span<const int32_t> history, int max_tokens) = 0;
  // Prefix snapshots: consume every committed tap row (the cache covers what it can), then the
  // rows from position `from` on and the tail; import_rows() takes rows [0, position - lag).
  virtual void sync(std::span<const int32_t> committed) = 0;
  virtual DraftRows export_rows(int64_t from) const = 0;
  virtual void import_rows(const DraftRows& rows, int64_t position) = 0;
  TapRecorder& taps() { return *rec_; }
  Model& target_;
  std::vector<float> last_logits_;

 private:
  std::shared_ptr<TapRecorder> rec_;
  // Stops drafting for this sequence, saying why once on stderr.
  void stop(const std::string& why);
  std::string name_, state_id_, why_;
};

int32_t argmax_row(std::span<const float> logits);

}  // namespace deltafin
