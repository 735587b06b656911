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
                    {"split_reads", s.split_reads},
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
      "{} {}: {} reads{}, {:.3f} GB in {:.3f} s busy = {:.2f} GB/s (probed {:.2f}){}{}",
      s.name == "model" ? "drive" : "home", s.name == "model" ? "model folder" : s.name, s.reads,
      s.split_reads > 0 ? fmt::format(" ({} pieces of split experts)", s.split_reads) : "",
      static_cast<double>(s.bytes_read) / 1e9, s.busy_s, s.bytes_per_s() / 1e9,
      s.probe_bytes_per_s / 1e9,
      s.hedges > 0 ? fmt::format(", {} hedged reads ({} won)", s.hedges, s.hedge_wins) : "",
      s.bad ? fmt::format(", not used after a failure: {}", s.bad_reason) : "");
}

namespace {

// Applies `op(mine, theirs)` to every counter of the two (the same list for - and +=).
template <class Op>
void each_counter(ExpertStats& a, const ExpertStats& b, Op op) {
  op(a.requests, b.requests);
  op(a.hits, b.hits);
  op(a.misses, b.misses);
  op(a.bytes_read, b.bytes_read);
  op(a.bytes_served, b.bytes_served);
  op(a.prefetch_issued, b.prefetch_issued);
  op(a.prefetch_used, b.prefetch_used);
  op(a.prefetch_wasted_bytes, b.prefetch_wasted_bytes);
  op(a.io_wait_s, b.io_wait_s);
  op(a.read_s, b.read_s);
}

template <class Op>
void each_counter(SourceStats& a, const SourceStats& b, Op op) {
  op(a.reads, b.reads);
  op(a.split_reads, b.split_reads);
  op(a.bytes_read, b.bytes_read);
  op(a.busy_s, b.busy_s);
  op(a.hedges, b.hedges);
  op(a.hedge_wins, b.hedge_wins);
  op(a.failures, b.failures);
}

constexpr auto kSubtract = [](auto& x, const auto& y) { x -= y; };
constexpr auto kAdd = [](auto& x, const auto& y) { x += y; };

}  // namespace

ExpertStats operator-(const ExpertStats& a, const ExpertStats& b) {
  ExpertStats d = a;
  each_counter(d, b, kSubtract);
  // Per drive: counters are differences, the rest (name, probe, bad) is the later snapshot's.
  for (size_t i = 0; i < d.sources.size() && i < b.sources.size(); ++i)
    each_counter(d.sources[i], b.sources[i], kSubtract);
  return d;
}

ExpertStats& operator+=(ExpertStats& a, const ExpertStats& b) {
  each_counter(a, b, kAdd);
  if (a.sources.size() < b.sources.size()) a.sources.resize(b.sources.size());
  for (size_t i = 0; i < b.sources.size(); ++i) {
    SourceStats& s = a.sources[i];
    const SourceStats& o = b.sources[i];
    s.name = o.name;
    s.probe_bytes_per_s = o.probe_bytes_per_s;
    s.experts = o.experts;
    s.bad = s.bad || o.bad;
    if (s.bad_reason.empty()) s.bad_reason = o.bad_reason;
    each_counter(s, o, kAdd);
  }
  return a;
}

}  // namespace deltafin
