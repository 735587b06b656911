// The draft-length choice (see draft_length.h): measured pass costs with a bytes-shaped prior,
// per-sequence acceptance, and a greedy search over added drafts.
#include "generate/draft_length.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "generate/speculative.h"
#include "model/model.h"

namespace deltafin {

namespace {
constexpr double kAlpha = 0.25;  // weight of a new observation in a row count's average
constexpr double kDecay = 0.95;  // acceptance counts fade so the estimate follows the text
constexpr int64_t kMaxRows = 1024;
}  // namespace

PassCostModel::PassCostModel(double trunk_bytes, double expert_bytes, int64_t moe_layers,
                             int64_t experts, int64_t top_k)
    : trunk_(trunk_bytes),
      expert_(expert_bytes),
      layers_(moe_layers),
      experts_(experts),
      top_k_(top_k) {}

PassCostModel PassCostModel::for_model(Model& model) {
  const ModelConfig& c = model.config();
  return PassCostModel(static_cast<double>(model.trunk_bytes_per_pass()),
                       static_cast<double>(model.expert_bytes()), c.num_moe_layers(),
                       c.moe.num_experts, c.moe.top_k);
}

double PassCostModel::bytes(int64_t rows) const {
  double union_experts = 0;
  if (experts_ > 0 && top_k_ > 0) {
    const double miss = 1.0 - static_cast<double>(top_k_) / static_cast<double>(experts_);
    union_experts =
        static_cast<double>(experts_) * (1.0 - std::pow(miss, static_cast<double>(rows)));
  }
  // At least one byte per row, so a model without experts or trunk still grows with rows.
  return trunk_ + expert_ * static_cast<double>(layers_) * union_experts +
         static_cast<double>(rows);
}

std::string PassCostModel::describe() const {
  std::string s;
  for (size_t r = 1; r < cells_.size(); ++r) {
    if (cells_[r].count == 0) continue;
    s += fmt::format("{}rows {}: {:.4f} s x {} passes, prior {:.3g} GB", s.empty() ? "" : "; ", r,
                     cells_[r].seconds, cells_[r].count, bytes(static_cast<int64_t>(r)) / 1e9);
  }
  return s.empty() ? "no pass measured" : s;
}

void PassCostModel::observe(int64_t rows, double seconds) {
  if (rows < 1 || rows > kMaxRows || !(seconds > 0)) return;
  if (static_cast<int64_t>(cells_.size()) <= rows) cells_.resize(static_cast<size_t>(rows) + 1);
  Cell& c = cells_[static_cast<size_t>(rows)];
  c.seconds = c.count == 0 ? seconds : (1 - kAlpha) * c.seconds + kAlpha * seconds;
  ++c.count;
}

double PassCostModel::predict(int64_t rows) const {
  rows = std::max<int64_t>(1, rows);
  if (rows < static_cast<int64_t>(cells_.size()) && cells_[static_cast<size_t>(rows)].count > 0)
    return cells_[static_cast<size_t>(rows)].seconds;
  // Seconds per prior byte from the nearest measured row counts below and above, so a pass
  // whose cost is compute rather than bytes (a model in RAM) is extrapolated from its own
  // measurements rather than from the prior's shape alone.
  int64_t lo = 0, hi = 0;
  for (int64_t r = std::min<int64_t>(rows, static_cast<int64_t>(cells_.size()) - 1); r >= 1; --r) {
    if (cells_[static_cast<size_t>(r)].count > 0) {
      lo = r;
      break;
    }
  }
  for (int64_t r = rows; r < static_cast<int64_t>(cells_.size()); ++r) {
    if (cells_[static_cast<size_t>(r)].count > 0) {
      hi = r;
      break;
    }
  }
  if (lo > 0 && hi > 0) {  // between two measurements: linear in rows
    const double a = cells_[static_cast<size_t>(lo)].seconds;
    const double b = cells_[static_cast<size_t>(hi)].seconds;
    return a + (b - a) * static_cast<double>(rows - lo) / static_cast<double>(hi - lo);
  }
  const int64_t ref = lo > 0 ? lo : hi;
  if (ref == 0) return bytes(rows) / bytes(1);
  const double at = cells_[static_cast<size_t>(ref)].seconds;
  if (lo > 0 && lo >= 2) {
    // Above the measured range: continue the measured per-row slope, never below the prior.
    int64_t lo2 = 0;
    for (int64_t r = lo - 1; r >= 1; --r) {
      if (cells_[static_cast<size_t>(r)].count > 0) {
        lo2 = r;
        break;
      }
    }
    if (lo2 > 0) {
      const double slope = std::max(
          0.0, (at - cells_[static_cast<size_t>(lo2)].seconds) / static_cast<double>(lo - lo2));
      return std::max(at + slope * static_cast<double>(rows - lo), at * bytes(rows) / bytes(lo));
    }
  }
  return at * bytes(rows) / bytes(ref);
}

void AcceptanceEstimate::observe(int proposed, int accepted) {
  if (proposed <= 0) return;
  accepted_ = kDecay * accepted_ + accepted;
  rejected_ = kDecay * rejected_ + (accepted < proposed ? 1.0 : 0.0);
}

void AcceptanceEstimate::observe_pass(std::span<const int32_t> proposal, int verified, int accepted,
                                      std::span<const int32_t> emitted) {
  const size_t v = static_cast<size_t>(verified);
  if (accepted == verified && proposal.size() > v && emitted.size() > v) {
    observe(verified + 1, accepted + (emitted[v] == proposal[v] ? 1 : 0));
  } else {
    observe(verified, accepted);
  }
}

double AcceptanceEstimate::rate() const {
  return accepted_ / (accepted_ + rejected_);
}

std::vector<double> expected_tokens(const DraftProposal& d, double rate) {
  std::vector<double> e(d.tokens.size() + 1, 1.0);
  double run = 1.0;
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    const double c = i < d.confidence.size() ? std::clamp<double>(d.confidence[i], 0.0, 1.0) : rate;
    run *= c;
    e[i + 1] = e[i] + run;
  }
  return e;
}

std::vector<int> choose_draft_lengths(std::span<const std::vector<double>> expected,
                                      int64_t base_rows, const PassCostModel& cost) {
  std::vector<int> k(expected.size(), 0), best_k = k;
  double tokens = 0;
  for (const auto& e : expected) tokens += e.empty() ? 0.0 : e[0];
  int64_t rows = std::max<int64_t>(1, base_rows);
  double best = tokens / cost.predict(rows);
  for (;;) {
    // The draft with the largest expected gain among the next draft of every sequence.
    size_t pick = expected.size();
    double gain = 0;
    for (size_t s = 0; s < expected.size(); ++s) {
      const size_t next = static_cast<size_t>(k[s]) + 1;
      if (next >= expected[s].size()) continue;
      const double g = expected[s][next] - expected[s][next - 1];
      if (g > gain) {
        gain = g;
        pick = s;
      }
    }
    if (pick == expected.size() || rows >= kMaxRows) break;
    ++k[pick];
    ++rows;
    tokens += gain;
    const double rate = tokens / cost.predict(rows);
    if (rate > best) {
      best = rate;
      best_k = k;
    }
  }
  return best_k;
}

int auto_draft_room(int room, double acceptance) {
  const double r = std::min(acceptance, 0.95);
  return std::min(room, static_cast<int>(std::ceil(r / (1 - r))) + 2);
}

}  // namespace deltafin
