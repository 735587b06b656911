// How many drafts to verify: a pass over more rows costs more (the trunk is read once, but each
// row adds the routed experts only it chose, plus its compute), and a draft only pays when it
// is likely to be accepted. So the choice needs two measured quantities and one rule:
//   - PassCostModel: seconds of a pass as a function of its rows, measured pass by pass (an
//     exponential average per row count) and, for row counts not measured yet, extrapolated
//     from the measured ones along the bytes a pass of r rows touches: trunk bytes once plus
//     the expected union of routed experts, E·(1 − (1 − k/E)^r) per MoE layer;
//   - AcceptanceEstimate: per sequence, the chance that the next draft is accepted given the
//     previous one was (the prefix-acceptance model), decayed so it follows the text;
//   - choose_draft_lengths: the lengths maximising expected verified tokens per second of the
//     pass, adding drafts one at a time (best marginal gain first) and keeping the best prefix,
//     so a draft whose expected gain is below its cost is never verified.
// Kept apart from verification (speculative.*): it decides how much to verify, never what is
// accepted, so it cannot change output. See docs/SPECULATIVE.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace deltafin {

class Model;
struct DraftProposal;

class PassCostModel {
 public:
  // Shape of the bytes prior: trunk bytes per pass, bytes of one routed expert, MoE layers,
  // experts per layer and experts chosen per row.
  PassCostModel(double trunk_bytes, double expert_bytes, int64_t moe_layers, int64_t experts,
                int64_t top_k);
  static PassCostModel for_model(Model& model);

  void observe(int64_t rows, double seconds);
  // Predicted seconds of a pass of `rows` rows (in the units of the observations; relative
  // bytes before any observation, which is all a ratio of costs needs).
  double predict(int64_t rows) const;
  // The prior: bytes a pass of `rows` rows touches.
  double bytes(int64_t rows) const;
  // The measured cells and the prior, one line ("rows 1: 0.0123 s x 5 passes, prior 1.2 GB; ..."),
  // for -v: why the draft length came out as it did.
  std::string describe() const;

 private:
  struct Cell {
    double seconds = 0;
    int64_t count = 0;
  };
  double trunk_, expert_;
  int64_t layers_, experts_, top_k_;
  std::vector<Cell> cells_;  // by rows
};

class AcceptanceEstimate {
 public:
  // After a verify pass: `accepted` of `proposed` drafts were accepted (a prefix).
  void observe(int proposed, int accepted);
  // After a verify pass over the first `verified` drafts of `proposal` that emitted `emitted`:
  // also counts the first draft left unverified when the pass reached it (the token emitted in
  // its place says whether it would have been kept), so a sequence whose drafts were all cut
  // keeps learning and drafts again once they start to be right.
  void observe_pass(std::span<const int32_t> proposal, int verified, int accepted,
                    std::span<const int32_t> emitted);
  // P(next draft accepted | previous accepted), from a prior of 0.5 worth two drafts.
  double rate() const;

 private:
  double accepted_ = 1.0, rejected_ = 1.0;
};

// Expected tokens a verify pass emits with the first k drafts of `d`, for k = 0 .. size:
// 1 + sum_j prod_{i<=j} c_i, with c_i the proposal's confidence where given, else `rate`.
std::vector<double> expected_tokens(const DraftProposal& d, double rate);

// Drafts to verify per sequence (each at most expected[s].size() − 1) in one pass that also
// carries `base_rows` rows (every sequence's own input included): the lengths maximising
// sum_s expected[s][k_s] / cost.predict(base_rows + sum_s k_s).
// With the automatic length, how many drafts to ask a drafter for: at most `room`, and at most
// two beyond the run expected to be accepted (r / (1 - r) at acceptance r). A draft model's
// chain step costs real time (on the demo model about a target pass), and drafts the cost
// model then cuts would be drafted for nothing.
int auto_draft_room(int room, double acceptance);

std::vector<int> choose_draft_lengths(std::span<const std::vector<double>> expected,
                                      int64_t base_rows, const PassCostModel& cost);

}  // namespace deltafin
