// Cuts the tracer's recent window into the engine view's timeline frame (engine_timeline.h).
#include "server/engine_timeline.h"

#include "core/trace.h"

namespace deltafin {

nlohmann::ordered_json engine_timeline_json(int64_t& seen) {
  const TraceRecent w = trace_recent(kEngineTimelinePasses, kEngineTimelineMaxSpans);
  if (w.passes == 0 || w.start_ns + w.duration_ns == seen) return nullptr;
  seen = w.start_ns + w.duration_ns;
  nlohmann::ordered_json threads = nlohmann::ordered_json::array();
  for (const auto& [tid, name] : w.threads) threads.push_back({{"tid", tid}, {"name", name}});
  nlohmann::ordered_json spans = nlohmann::ordered_json::array();
  for (const TraceRecentSpan& s : w.spans) {
    nlohmann::ordered_json args = nlohmann::ordered_json::object();
    for (int i = 0; i < s.nargs; ++i) args[s.args[i].key] = s.args[i].value;
    spans.push_back(
        nlohmann::ordered_json::array({s.tid, s.name, static_cast<double>(s.ts_ns) / 1e3,
                                       static_cast<double>(s.dur_ns) / 1e3, std::move(args)}));
  }
  nlohmann::ordered_json j;
  j["passes"] = w.passes;
  j["duration_us"] = static_cast<double>(w.duration_ns) / 1e3;
  j["omitted"] = w.omitted;
  j["threads"] = std::move(threads);
  j["spans"] = std::move(spans);
  return j;
}

}  // namespace deltafin
