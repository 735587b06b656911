// Prometheus text rendering of the server counters (see metrics.h). Names follow the
// Prometheus conventions: `_total` for counters, base units (seconds, bytes).
#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/timer.h"

namespace deltafin::server {

namespace {
constexpr double kRateWindow = 10.0;  // seconds the tokens/s gauge averages over
}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(m_);
  ++requests_[{endpoint, status}];
}

void Metrics::count_pass(int64_t rows, int64_t prompt_rows, int64_t generated, int64_t sequences,
                         double seconds) {
  std::lock_guard<std::mutex> lock(m_);
  ++passes_;
  rows_ += static_cast<uint64_t>(rows);
  rows_max_ = std::max(rows_max_, static_cast<uint64_t>(rows));
  prompt_rows_ += static_cast<uint64_t>(prompt_rows);
  generated_ += static_cast<uint64_t>(generated);
  batched_sequences_ += static_cast<uint64_t>(sequences);
  pass_seconds_ += seconds;
  const double now = now_seconds();
  recent_.emplace_back(now, generated);
  while (!recent_.empty() && recent_.front().first < now - kRateWindow) recent_.pop_front();
}

void Metrics::count_drafts(int64_t proposed, int64_t accepted, int64_t decode_sequences,
                           int64_t decode_tokens) {
  std::lock_guard<std::mutex> lock(m_);
  drafting_ = true;
  draft_proposed_ += static_cast<uint64_t>(proposed);
  draft_accepted_ += static_cast<uint64_t>(accepted);
  target_passes_ += static_cast<uint64_t>(decode_sequences);
  decode_tokens_ += static_cast<uint64_t>(decode_tokens);
}

void Metrics::count_finished(int64_t prompt_tokens, int64_t cached_tokens,
                             int64_t completion_tokens) {
  std::lock_guard<std::mutex> lock(m_);
  ++finished_;
  prompt_tokens_ += static_cast<uint64_t>(prompt_tokens);
  cached_tokens_ += static_cast<uint64_t>(cached_tokens);
  completion_tokens_ += static_cast<uint64_t>(completion_tokens);
}

void Metrics::count_images(int64_t prompt_images, int64_t prompt_image_tokens, int64_t encoded,
                           int64_t encoded_tokens, double seconds) {
  std::lock_guard<std::mutex> lock(m_);
  prompt_images_ += static_cast<uint64_t>(prompt_images);
  prompt_image_tokens_ += static_cast<uint64_t>(prompt_image_tokens);
  images_encoded_ += static_cast<uint64_t>(encoded);
  image_tokens_encoded_ += static_cast<uint64_t>(encoded_tokens);
  vision_seconds_ += seconds;
}

void Metrics::set_vision(int64_t params, uint64_t weight_bytes, uint64_t work_bytes) {
  std::lock_guard<std::mutex> lock(m_);
  vision_params_ = params;
  vision_weight_bytes_ = weight_bytes;
  vision_work_bytes_ = work_bytes;
}

void Metrics::set_prefix(const PrefixStats& s) {
  std::lock_guard<std::mutex> lock(m_);
  prefix_ = s;
  prefix_on_ = true;
}

void Metrics::set_gauges(int64_t queued, int64_t active) {
  std::lock_guard<std::mutex> lock(m_);
  queued_ = queued;
  active_ = active;
}

void Metrics::set_storage(const ExpertStats& experts, const TrunkStats& trunk, uint64_t recall_hits,
                          uint64_t recall_requested, std::optional<ExpertHeat> heat) {
  std::lock_guard<std::mutex> lock(m_);
  experts_ = experts;
  trunk_ = trunk;
  recall_hits_ = recall_hits;
  recall_requested_ = recall_requested;
  if (heat) {
    heat_ = std::move(*heat);
    ++heat_version_;
  }
}

void Metrics::set_static(int64_t context, int64_t parallel, int64_t queue_capacity,
                         int64_t pass_rows) {
  std::lock_guard<std::mutex> lock(m_);
  pass_rows_limit_ = pass_rows;
  context_ = context;
  parallel_ = parallel;
  queue_capacity_ = queue_capacity;
}

void Metrics::set_ready(bool ready) {
  std::lock_guard<std::mutex> lock(m_);
  ready_ = ready;
}

void Metrics::set_engine_info(nlohmann::ordered_json info) {
  std::lock_guard<std::mutex> lock(m_);
  engine_info_ = std::move(info);
}

double Metrics::tokens_per_second_locked() const {
  if (recent_.empty()) return 0.0;
  double recent = 0;
  for (const auto& r : recent_) recent += static_cast<double>(r.second);
  const double span = std::min(std::max(1.0, now_seconds() - recent_.front().first), kRateWindow);
  return recent / span;
}

nlohmann::ordered_json Metrics::engine_snapshot(uint64_t& heat_seen) const {
  std::lock_guard<std::mutex> lock(m_);
  nlohmann::ordered_json j = engine_info_;
  j["time_s"] = now_seconds();
  j["ready"] = ready_;
  j["queue"] = queued_;
  j["queue_capacity"] = queue_capacity_;
  j["active"] = active_;
  j["parallel"] = parallel_;
  j["tokens_per_second"] = tokens_per_second_locked();
  j["generated_tokens"] = generated_;
  j["prefill_tokens"] = prompt_rows_;
  j["forward_passes"] = passes_;
  j["forward_seconds"] = pass_seconds_;
  if (prefix_on_) {  // the page's engine view: what the prefix store holds and saved
    j["state_cache"] = {{"ram_snapshots", prefix_.ram_snapshots},
                        {"ram_bytes", prefix_.ram_bytes},
                        {"disk_snapshots", prefix_.disk_snapshots},
                        {"disk_bytes", prefix_.disk_bytes},
                        {"lookups", prefix_.lookups},
                        {"ram_hits", prefix_.ram_hits},
                        {"disk_hits", prefix_.disk_hits},
                        {"prompt_tokens_reused", cached_tokens_}};
  }
  if (drafting_) {  // serve --draft: the page shows acceptance and tokens per pass
    j["draft_n"] = draft_proposed_;
    j["draft_n_accepted"] = draft_accepted_;
    j["tokens_per_pass"] = target_passes_ > 0 ? static_cast<double>(decode_tokens_) /
                                                    static_cast<double>(target_passes_)
                                              : 0.0;
  }
  j["experts"] = {{"requests", experts_.requests},
                  {"hits", experts_.hits},
                  {"misses", experts_.misses},
                  {"bytes_read", experts_.bytes_read},
                  {"io_wait_s", experts_.io_wait_s},
                  {"read_s", experts_.read_s},
                  {"prefetch_issued", experts_.prefetch_issued},
                  {"prefetch_used", experts_.prefetch_used}};
  j["trunk"] = {{"bytes_streamed", trunk_.bytes_streamed}, {"wait_s", trunk_.wait_s}};
  if (!experts_.sources.empty()) j["homes"] = sources_json(experts_.sources);
  if (heat_seen != heat_version_) {
    heat_seen = heat_version_;
    j["heat"] = {{"layers", heat_.layers},
                 {"experts", heat_.experts},
                 {"hits", heat_.hits},
                 {"misses", heat_.misses}};
  }
  return j;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(m_);
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  // One unlabelled sample with its HELP and TYPE lines.
  auto sample = [&](const char* name, const char* type, const char* help, auto v) {
    metric(name, type, help);
    out += fmt::format("{} {}\n", name, v);
  };

  metric("deltafin_requests_total", "counter", "HTTP requests by endpoint and status code.");
  for (const auto& [k, n] : requests_) {
    out += fmt::format("deltafin_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", k.first,
                       k.second, n);
  }
  sample("deltafin_prompt_tokens_total", "counter",
         "Prompt tokens of finished generations (cached included).", prompt_tokens_);
  sample("deltafin_cached_prompt_tokens_total", "counter",
         "Prompt tokens continued from kept snapshots (never prefilled).", cached_tokens_);
  sample("deltafin_completion_tokens_total", "counter", "Generated tokens of finished generations.",
         completion_tokens_);
  sample("deltafin_generations_total", "counter", "Generations that ran to an end (any reason).",
         finished_);
  sample("deltafin_generated_tokens_total", "counter",
         "Tokens sampled by the engine (all requests, also unfinished).", generated_);
  sample("deltafin_prefill_tokens_total", "counter", "Prompt rows run through forward passes.",
         prompt_rows_);
  sample("deltafin_tokens_per_second", "gauge",
         "Generated tokens per second, all sequences, over the last 10 s.",
         tokens_per_second_locked());
  sample("deltafin_forward_passes_total", "counter",
         "Forward passes (one carries a row block of every active sequence).", passes_);
  sample("deltafin_forward_rows_total", "counter", "Rows (tokens) run through forward passes.",
         rows_);
  sample("deltafin_forward_rows_max", "gauge", "Most rows one forward pass has carried.",
         rows_max_);
  sample("deltafin_forward_rows_limit", "gauge",
         "Rows one pass may carry, from the memory plan (--prefill-chunk auto; 0: N per "
         "sequence).",
         pass_rows_limit_);
  sample("deltafin_forward_sequences_total", "counter",
         "Sequences per pass, summed (divide by passes for the batch size).", batched_sequences_);
  sample("deltafin_forward_seconds_total", "counter", "Time spent in forward passes.",
         pass_seconds_);
  sample("deltafin_draft_proposed_total", "counter",
         "Drafted tokens verified by target passes (serve --draft).", draft_proposed_);
  sample("deltafin_draft_accepted_total", "counter", "Drafted tokens accepted by verification.",
         draft_accepted_);
  sample("deltafin_target_passes_total", "counter",
         "Decode passes per sequence (a step decoding n sequences counts n).", target_passes_);
  sample("deltafin_decode_tokens_total", "counter",
         "Tokens emitted by those decode passes (divide by target passes for tokens per pass).",
         decode_tokens_);
  // K3's vision tower (docs/VISION.md §11.8): images of started sequences, those the tower ran on.
  sample("deltafin_vision_prompt_images_total", "counter",
         "Images in the prompts of started sequences (encoded or in a kept state).",
         prompt_images_);
  sample("deltafin_vision_prompt_image_tokens_total", "counter",
         "Image tokens (<|media_pad|> rows) of those images: prompt tokens for the trunk.",
         prompt_image_tokens_);
  sample("deltafin_vision_images_encoded_total", "counter",
         "Images the vision tower encoded (not found in a kept state).", images_encoded_);
  sample("deltafin_vision_image_tokens_encoded_total", "counter",
         "Image tokens of the images the tower encoded.", image_tokens_encoded_);
  sample("deltafin_vision_seconds_total", "counter",
         "Time decoding, preprocessing and running the vision tower and projector.",
         vision_seconds_);
  sample("deltafin_vision_tower_params", "gauge",
         "Parameters of the vision tower and projector (0: a text-only model).", vision_params_);
  sample("deltafin_vision_tower_bytes", "gauge",
         "RAM of the vision tower's weights as bound, kept resident (the memory plan's share).",
         vision_weight_bytes_);
  sample("deltafin_vision_work_bytes", "gauge",
         "The memory plan's working memory for the tower's largest image.", vision_work_bytes_);
  sample("deltafin_queue_depth", "gauge", "Requests waiting for a slot.", queued_);
  sample("deltafin_queue_capacity", "gauge", "Most requests that may wait (--queue).",
         queue_capacity_);
  sample("deltafin_active_sequences", "gauge", "Sequences being prefilled or decoded.", active_);
  sample("deltafin_parallel_slots", "gauge", "Most sequences decoded together (--parallel).",
         parallel_);
  sample("deltafin_context_tokens", "gauge", "Positions a sequence may reach.", context_);
  sample("deltafin_model_ready", "gauge", "1 once the model is loaded.", ready_ ? 1 : 0);
  // The prefix store (prefix/prefix_store.h): snapshots and bytes per tier, lookups and hits.
  auto tiers = [&](const char* name, const char* type, const char* help, auto ram, auto disk) {
    metric(name, type, help);
    out += fmt::format("{}{{tier=\"ram\"}} {}\n{}{{tier=\"disk\"}} {}\n", name, ram, name, disk);
  };
  tiers("deltafin_state_snapshots", "gauge", "Prefix snapshots kept, by tier.",
        prefix_.ram_snapshots, prefix_.disk_snapshots);
  tiers("deltafin_state_snapshot_bytes", "gauge", "Bytes of prefix snapshots, by tier.",
        prefix_.ram_bytes, prefix_.disk_bytes);
  tiers("deltafin_state_cache_hits_total", "counter",
        "Requests that continued from a kept snapshot, by the tier it came from.", prefix_.ram_hits,
        prefix_.disk_hits);
  sample("deltafin_state_cache_lookups_total", "counter", "Prompts looked up in the prefix store.",
         prefix_.lookups);
  sample("deltafin_state_cache_saves_total", "counter", "Snapshots taken.", prefix_.saves);
  sample("deltafin_state_cache_disk_errors_total", "counter",
         "Snapshot files that could not be written or were found corrupt.", prefix_.disk_errors);
  sample("deltafin_expert_requests_total", "counter", "Routed experts asked for by passes.",
         experts_.requests);
  sample("deltafin_expert_hits_total", "counter", "Routed experts served from RAM.", experts_.hits);
  sample("deltafin_expert_misses_total", "counter", "Routed experts read from storage.",
         experts_.misses);
  sample("deltafin_expert_bytes_read_total", "counter", "Expert bytes read from storage.",
         experts_.bytes_read);
  sample("deltafin_expert_bytes_served_total", "counter", "Expert bytes handed to compute.",
         experts_.bytes_served);
  sample("deltafin_expert_io_wait_seconds_total", "counter",
         "Time compute waited for expert reads.", experts_.io_wait_s);
  sample("deltafin_expert_read_seconds_total", "counter",
         "Time reader threads spent reading experts (summed over readers).", experts_.read_s);
  sample("deltafin_expert_prefetch_issued_total", "counter",
         "Expert reads started by the look-ahead predictor.", experts_.prefetch_issued);
  sample("deltafin_expert_prefetch_used_total", "counter",
         "Prefetched experts that a pass then asked for.", experts_.prefetch_used);
  sample("deltafin_expert_prefetch_wasted_bytes_total", "counter",
         "Bytes of prefetched experts evicted unused.", experts_.prefetch_wasted_bytes);
  sample("deltafin_prefetch_predicted_hits_total", "counter",
         "Requested experts the look-ahead predictor had predicted.", recall_hits_);
  sample("deltafin_prefetch_predicted_requests_total", "counter",
         "Requested experts in layers that had a prediction.", recall_requested_);
  sample("deltafin_prefetch_recall", "gauge",
         "Predicted hits / predicted requests since start (0 without predictions).",
         recall_requested_ > 0
             ? static_cast<double>(recall_hits_) / static_cast<double>(recall_requested_)
             : 0.0);
  sample("deltafin_trunk_bytes_streamed_total", "counter",
         "Trunk bytes read from storage for layers that are not resident.", trunk_.bytes_streamed);
  sample("deltafin_trunk_io_wait_seconds_total", "counter",
         "Time compute waited for streamed trunk layers.", trunk_.wait_s);
  // With homes (--home): one sample per drive, the model folder as drive="model".
  if (!experts_.sources.empty()) {
    auto per_drive = [&](const char* name, const char* type, const char* help, auto value) {
      metric(name, type, help);
      for (const auto& d : experts_.sources) {
        std::string label;
        for (char c : d.name) {
          if (c == '"' || c == '\\') label += '\\';
          if (c == '\n') {
            label += "\\n";
            continue;
          }
          label += c;
        }
        out += fmt::format("{}{{drive=\"{}\"}} {}\n", name, label, value(d));
      }
    };
    per_drive("deltafin_drive_reads_total", "counter",
              "Expert reads each drive served (a whole expert or a piece of one).",
              [](const SourceStats& d) { return d.reads; });
    per_drive("deltafin_drive_split_reads_total", "counter",
              "Of those, pieces of experts read from several drives at once.",
              [](const SourceStats& d) { return d.split_reads; });
    per_drive("deltafin_drive_bytes_read_total", "counter", "Expert bytes read from each drive.",
              [](const SourceStats& d) { return d.bytes_read; });
    per_drive("deltafin_drive_busy_seconds_total", "counter",
              "Time each drive had at least one expert read in flight.",
              [](const SourceStats& d) { return d.busy_s; });
    per_drive("deltafin_drive_read_bytes_per_second", "gauge",
              "Bytes read per busy second, since start.",
              [](const SourceStats& d) { return d.bytes_per_s(); });
    per_drive("deltafin_drive_probe_bytes_per_second", "gauge",
              "Read bandwidth deltafin place probed (0: not probed).",
              [](const SourceStats& d) { return d.probe_bytes_per_s; });
    per_drive("deltafin_drive_hedged_reads_total", "counter",
              "Late reads repeated on this drive (another copy's read was late).",
              [](const SourceStats& d) { return d.hedges; });
    per_drive("deltafin_drive_failures_total", "counter",
              "Reads that failed on this drive and were read from another copy.",
              [](const SourceStats& d) { return d.failures; });
    per_drive("deltafin_drive_up", "gauge", "1 while the drive is used, 0 after a failure.",
              [](const SourceStats& d) { return d.bad ? 0 : 1; });
  }
  return out;
}

}  // namespace deltafin::server
