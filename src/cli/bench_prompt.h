// What `deltafin bench` feeds the model (cmd_bench.cpp, bench_turns.cpp): deterministic
// pseudo-random ids over the ordinary (non-special) ids, and a prompt prefilled in passes of the
// pass plan's rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/engine.h"

namespace deltafin::cli {

// An xorshift64 stream of ids below the vocabulary's last 256 (where K3 keeps its special
// tokens; a vocabulary of 512 or fewer uses every id).
class SyntheticIds {
 public:
  SyntheticIds(int64_t vocab, uint64_t seed)
      : ordinary_(static_cast<uint64_t>(std::max<int64_t>(1, vocab > 512 ? vocab - 256 : vocab))),
        x_(seed) {}
  int32_t next() {
    x_ ^= x_ << 13;
    x_ ^= x_ >> 7;
    x_ ^= x_ << 17;
    return static_cast<int32_t>(x_ % ordinary_);
  }

 private:
  uint64_t ordinary_;
  uint64_t x_;
};

// Feeds `ids` to `state` in passes of at most `rows`; returns the logits of the last pass.
inline std::vector<float> prefill_in_passes(LoadedModel& model, State& state,
                                            std::span<const int32_t> ids, size_t rows) {
  std::vector<float> logits;
  for (size_t b = 0; b < ids.size(); b += rows)
    logits = model.forward(state, ids.subspan(b, std::min(ids.size() - b, rows)));
  return logits;
}

}  // namespace deltafin::cli
