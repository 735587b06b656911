// Server counters for `GET /metrics`, in the Prometheus text format (version 0.0.4).
//
// HTTP threads count requests by endpoint and status; the engine thread counts tokens and
// passes and, after every pass, copies the expert provider's statistics here, so that /metrics
// never calls into the model while a pass runs. Gauges (queue depth, active sequences) are set by
// the scheduler as they change. Everything is behind one mutex: updates are a few per pass.
// The engine view's snapshots are read from here too, so watching the engine never calls into
// the engine thread.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "model/experts.h"
#include "model/weights.h"
#include "prefix/prefix_store.h"

namespace deltafin::server {

class Metrics {
 public:
  void count_request(const std::string& endpoint, int status);
  // One engine step: prompt rows and generated tokens it processed.
  void count_pass(int64_t rows, int64_t prompt_rows, int64_t generated, int64_t sequences,
                  double seconds);
  // Speculative decoding in one engine step: drafts verified and accepted, sequences whose
  // decode row was in the pass (target passes, one per sequence) and the tokens they emitted.
  void count_drafts(int64_t proposed, int64_t accepted, int64_t decode_sequences,
                    int64_t decode_tokens);
  void count_finished(int64_t prompt_tokens, int64_t cached_tokens, int64_t completion_tokens);
  // The images of a sequence that started (runtime/images.h ImageEncodeStats): in its prompt,
  // encoded by the tower (the others were in a kept state), their image tokens, the seconds.
  void count_images(int64_t prompt_images, int64_t prompt_image_tokens, int64_t encoded,
                    int64_t encoded_tokens, double seconds);
  // The vision tower's share of the memory plan (0 for a text-only model).
  void set_vision(int64_t params, uint64_t weight_bytes, uint64_t work_bytes);
  void set_gauges(int64_t queued, int64_t active);
  // Storage counters after a pass: the expert provider's, the trunk streamer's, and the
  // look-ahead predictor's recall totals (requested experts that had been predicted, of those
  // requested in layers with a prediction). With `heat`, the per (layer, expert) counters are
  // replaced under the same lock, so a snapshot's heat map sums to its expert totals.
  void set_storage(const ExpertStats& experts, const TrunkStats& trunk, uint64_t recall_hits,
                   uint64_t recall_requested, std::optional<ExpertHeat> heat = std::nullopt);
  // pass_rows: the rows one pass may carry (the plan's, with --prefill-chunk auto; 0 = no cap).
  void set_static(int64_t context, int64_t parallel, int64_t queue_capacity, int64_t pass_rows = 0);
  void set_ready(bool ready);
  // The prefix store's counters (prefix/prefix_store.h), copied by the engine thread.
  void set_prefix(const PrefixStats& s);
  // What does not change while serving: the memory plan and the probed disk bandwidth.
  void set_engine_info(nlohmann::ordered_json info);

  std::string render() const;  // the /metrics body
  // One snapshot for GET /v1/engine/events (docs/SERVER.md): the engine info, the counters
  // above, gauges and the heat map. Counters are totals: the page takes differences. The heat
  // map (at K3 size, 93 x 896 counters twice) is included only when it changed since the
  // version in `heat_seen`, which is updated; start with kNoHeatSeen.
  static constexpr uint64_t kNoHeatSeen = ~0ull;
  nlohmann::ordered_json engine_snapshot(uint64_t& heat_seen) const;

 private:
  mutable std::mutex m_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t passes_ = 0, rows_ = 0, prompt_rows_ = 0, generated_ = 0, batched_sequences_ = 0;
  uint64_t rows_max_ = 0;
  int64_t pass_rows_limit_ = 0;
  double pass_seconds_ = 0;
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0, finished_ = 0;
  uint64_t prompt_images_ = 0, prompt_image_tokens_ = 0, images_encoded_ = 0;
  uint64_t image_tokens_encoded_ = 0;
  double vision_seconds_ = 0;
  int64_t vision_params_ = 0;
  uint64_t vision_weight_bytes_ = 0, vision_work_bytes_ = 0;
  PrefixStats prefix_;
  bool prefix_on_ = false;
  uint64_t draft_proposed_ = 0, draft_accepted_ = 0, target_passes_ = 0, decode_tokens_ = 0;
  bool drafting_ = false;
  int64_t queued_ = 0, active_ = 0;
  int64_t context_ = 0, parallel_ = 0, queue_capacity_ = 0;
  bool ready_ = false;
  ExpertStats experts_;
  TrunkStats trunk_;
  uint64_t recall_hits_ = 0, recall_requested_ = 0;
  // (time, generated tokens) per pass over the last few seconds, for the tokens/s gauge.
  std::deque<std::pair<double, int64_t>> recent_;
  ExpertHeat heat_;
  uint64_t heat_version_ = 0;
  nlohmann::ordered_json engine_info_ = nlohmann::ordered_json::object();

  double tokens_per_second_locked() const;
};

}  // namespace deltafin::server
