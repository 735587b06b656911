// The engine view's timeline (docs/SERVER.md, "Engine events"): the last few forward passes as
// the tracer's recent window holds them (core/trace.h), written as the compact JSON the page
// draws. Spans are arrays rather than objects ([tid, name, start µs, duration µs, args]) because
// a K3 pass has thousands of them and a frame goes out twice a second.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

namespace deltafin {

// How many passes the view shows and the most spans a frame carries (the longest kept).
constexpr int kEngineTimelinePasses = 3;
constexpr size_t kEngineTimelineMaxSpans = 6000;

// The timeline of the last passes, or null when there is none yet or it has not changed since
// `seen` (the end of the window last sent, updated; start with -1).
nlohmann::ordered_json engine_timeline_json(int64_t& seen);

}  // namespace deltafin
