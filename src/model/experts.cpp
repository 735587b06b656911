#include "model/experts.h"

#include <fmt/format.h>

namespace deltafin {

nlohmann::json sources_json(const std::vector<SourceStats>& sources) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& s : sources) {
    list.push_back({{"name", s.name},
                    {"kind", s.name == "model" ? "model" : "home"},
                    {"experts", s.experts},
                    {"probe_bytes_per_s", s.probe_bytes_per_s},
                    {"reads", s.reads},
                    {"bytes_read", s.bytes_read},
                    {"busy_s", s.busy_s},
                    {"bytes_per_s", s.bytes_per_s()},
                    {"gb_per_s", s.bytes_per_s() / 1e9},
                    {"hedges", s.hedges},
                    {"hedge_wins", s.hedge_wins},
                    {"failures", s.failures},
                    {"bad", s.bad},
                    {"bad_reason", s.bad_reason}});
  }
  return list;
}

std::string describe_source(const SourceStats& s) {
  return fmt::format(
      "{} {}: {} reads, {:.3f} GB in {:.3f} s busy = {:.2f} GB/s (probed {:.2f}){}{}",
      s.name == "model" ? "drive" : "home", s.name == "model" ? "model folder" : s.name, s.reads,
      static_cast<double>(s.bytes_read) / 1e9, s.busy_s, s.bytes_per_s() / 1e9,
      s.probe_bytes_per_s / 1e9,
      s.hedges > 0 ? fmt::format(", {} hedged reads ({} won)", s.hedges, s.hedge_wins) : "",
      s.bad ? fmt::format(", not used after a failure: {}", s.bad_reason) : "");
}

ExpertStats operator-(const ExpertStats& a, const ExpertStats& b) {
  ExpertStats d;
  d.requests = a.requests - b.requests;
  d.hits = a.hits - b.hits;
  d.misses = a.misses - b.misses;
  d.bytes_read = a.bytes_read - b.bytes_read;
  d.bytes_served = a.bytes_served - b.bytes_served;
  d.prefetch_issued = a.prefetch_issued - b.prefetch_issued;
  d.prefetch_used = a.prefetch_used - b.prefetch_used;
  d.prefetch_wasted_bytes = a.prefetch_wasted_bytes - b.prefetch_wasted_bytes;
  d.io_wait_s = a.io_wait_s - b.io_wait_s;
  d.read_s = a.read_s - b.read_s;
  // Per drive: counters are differences, the rest (name, probe, bad) is the later snapshot's.
  d.sources = a.sources;
  for (size_t i = 0; i < d.sources.size() && i < b.sources.size(); ++i) {
    SourceStats& s = d.sources[i];
    const SourceStats& o = b.sources[i];
    s.reads -= o.reads;
    s.bytes_read -= o.bytes_read;
    s.busy_s -= o.busy_s;
    s.hedges -= o.hedges;
    s.hedge_wins -= o.hedge_wins;
    s.failures -= o.failures;
  }
  return d;
}

ExpertStats& operator+=(ExpertStats& a, const ExpertStats& b) {
  a.requests += b.requests;
  a.hits += b.hits;
  a.misses += b.misses;
  a.bytes_read += b.bytes_read;
  a.bytes_served += b.bytes_served;
  a.prefetch_issued += b.prefetch_issued;
  a.prefetch_used += b.prefetch_used;
  a.prefetch_wasted_bytes += b.prefetch_wasted_bytes;
  a.io_wait_s += b.io_wait_s;
  a.read_s += b.read_s;
  if (a.sources.size() < b.sources.size()) a.sources.resize(b.sources.size());
  for (size_t i = 0; i < b.sources.size(); ++i) {
    SourceStats& s = a.sources[i];
    const SourceStats& o = b.sources[i];
    s.name = o.name;
    s.probe_bytes_per_s = o.probe_bytes_per_s;
    s.experts = o.experts;
    s.bad = s.bad || o.bad;
    if (s.bad_reason.empty()) s.bad_reason = o.bad_reason;
    s.reads += o.reads;
    s.bytes_read += o.bytes_read;
    s.busy_s += o.busy_s;
    s.hedges += o.hedges;
    s.hedge_wins += o.hedge_wins;
    s.failures += o.failures;
  }
  return a;
}

}  // namespace deltafin
