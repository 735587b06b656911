// What EAGLE-3, DSpark and MTP share as drafters of a target: a tap recorder attached to the
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
  const std::string& name() const { return name_; }
  Model& target_;
  std::vector<float> last_logits_;

 private:
  std::shared_ptr<TapRecorder> rec_;
  // Stops drafting for this sequence, saying why once on stderr.
  void stop(const std::string& why);
  std::string name_, state_id_, why_;
};

// EAGLE-3 and MTP keep one draft cache whose row p holds (feature_p, x_{p+1}): the rows lag the
// committed positions by one, and the features of positions not yet in a row (at rest, the last
// committed one's) are the tail. Resetting, syncing, saving and restoring such a cache is the
// same for both; they say where the rows live.
class LaggedTapDrafter : public TapDrafter {
 public:
  // `row_width`: floats per cache row; `feature_width`: floats per tail feature.
  LaggedTapDrafter(Model& target, TapSpec spec, std::string name, std::string state_id,
                   int64_t row_width, int64_t feature_width);

 protected:
  void reset() final;
  void sync(std::span<const int32_t> committed) final;
  DraftRows export_rows(int64_t from) const final;
  void import_rows(const DraftRows& rows, int64_t position) final;
  // Brings the cache to L-1 rows and tail_ to the pending feature of x_{L-1}; `history` is the
  // L committed tokens then an anchor that committing never reads.
  virtual void commit_rows(std::span<const int32_t> history) = 0;
  // For commit_rows of L committed positions: the first position whose feature is not held yet
  // (cache_len_ + tail rows), after checking that the taps recorded cover it through L - 1.
  int64_t first_unheld(int64_t L);
  // The cache's rows (at least cache_len_ of them), and their replacement by `count` rows: by
  // default cache_, for a drafter whose rows live elsewhere (MTP: in a State) where they live.
  virtual std::span<const float> cache_rows() const { return cache_; }
  virtual void replace_cache_rows(std::vector<float> rows, int64_t) { cache_ = std::move(rows); }

  std::vector<float> cache_;  // [cache_len_ (+ chain rows while proposing)][row_width]
  int64_t cache_len_ = 0;     // committed rows (chain rows are dropped after each proposal)
  std::vector<float> tail_;   // features of positions [cache_len_, cache_len_ + rows)

 private:
  int64_t row_width_, feature_width_;
};

int32_t argmax_row(std::span<const float> logits);

}  // namespace deltafin
