// A timeline of where a run's time goes (`--trace FILE`, docs/TRACING.md): spans and counters
// written once, at the end, as the Trace Event Format that Perfetto and chrome://tracing open.
//
// Why it is built this way:
//  * It lives in core, the lowest layer, so every layer (model, storage, generate, draft) can
//    mark its own work with one line, an RAII TraceSpan, without a dependency pointing up.
//  * Off costs one predictable branch: a span reads one atomic flag and does nothing
//    else (no clock read, no allocation). Arguments are (static name, integer) pairs held inline
//    in the span, so building them allocates nothing either way.
//  * On, each thread appends finished events to its own buffer. The buffer's mutex is only ever
//    contended by the final write, so the hot path is an uncontended lock and a vector append;
//    buffers outlive their threads (the registry owns them), so a reader pool that shut down
//    before the end still shows up.
//  * Bounded: at most `cap` events in all (2 million by default, ~270 MB); past that, events are
//    counted as dropped and the file says so in its `otherData`.
//  * The file is created (0600, a random temporary name beside the target) when tracing starts,
//    so an unwritable path fails before the run, and renamed over the target once written.
//  * A second sink, the recent window, serves the server's engine view (docs/SERVER.md): while
//    someone watches, events also go into one bounded ring (the last 32768 spans, all threads,
//    under one lock), from which trace_recent() cuts the last few passes. Nobody watching, it
//    costs nothing; the file and the window can be on together. Both count time from one
//    process-wide epoch, so the file subtracts its own start.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace deltafin {

namespace trace_detail {
extern std::atomic<bool> g_trace_on;
}

// One argument of an event: a static key and an integer value (bytes, a layer, an expert id).
// Trivially constructible, so a span's argument slots cost nothing while tracing is off.
struct TraceArg {
  const char* key;
  int64_t value;
  TraceArg() = default;
  template <typename T>
  TraceArg(const char* k, T v) : key(k), value(static_cast<int64_t>(v)) {}
};
constexpr int kTraceMaxArgs = 6;

// Acquire (a plain load on x86 and one instruction on arm64): a span that sees the flag set also
// sees the epoch and cap trace_start wrote before setting it.
inline bool trace_on() {
  return trace_detail::g_trace_on.load(std::memory_order_acquire);
}

// Starts tracing into `path`: creates its temporary file now (throws IoError naming the path
// when that cannot be done, or when `path` is a folder) and turns the spans on. `cap` bounds the
// events kept (0: the default, 2 million).
void trace_start(const std::string& path, int64_t cap = 0);
// Turns the spans off and writes the file (temporary, then renamed over `path`). Returns the
// number of events written; throws IoError when the write fails (the temporary is removed). A
// second call, or one without trace_start, does nothing and returns 0.
int64_t trace_finish();
// Gives up a started trace: its temporary file is removed and nothing is written (a run that
// failed before it began).
void trace_abandon();

// The recent window. trace_recent_watch(true) registers a watcher (a browser showing the engine
// view) and turns the spans on; trace_recent_watch(false) removes it, and the window is dropped
// when the last one leaves.
void trace_recent_watch(bool on);
struct TraceRecentSpan {
  int tid = 0;
  const char* name = "";
  const char* cat = "";
  int64_t ts_ns = 0, dur_ns = 0;  // from the window's start
  int nargs = 0;
  TraceArg args[kTraceMaxArgs];
};
struct TraceRecent {
  int passes = 0;        // complete `pass` spans in the window (0: none yet)
  int64_t start_ns = 0;  // the window, from the process's trace epoch
  int64_t duration_ns = 0;
  int64_t omitted = 0;  // spans left out to stay within max_spans (the shortest)
  std::vector<std::pair<int, std::string>> threads;  // (tid, name) of the threads in `spans`
  std::vector<TraceRecentSpan> spans;                // every span overlapping the window
};
// The window from the start of the last `passes` complete `pass` spans to the end of the last,
// with at most `max_spans` spans (the longest kept). Empty while nobody watches or before a pass.
TraceRecent trace_recent(int passes, size_t max_spans);

// Names the calling thread in the timeline ("reader", 3 -> "reader 3"; index < 0: no number).
// Cheap and allowed while tracing is off (the name is kept for when the thread first records).
void trace_thread_name(const char* base, int index = -1);

// A counter sample ("ph":"C"): the series in `values` at this moment, drawn as a graph.
void trace_counter_impl(const char* name, std::initializer_list<TraceArg> values);
inline void trace_counter(const char* name, std::initializer_list<TraceArg> values) {
  if (trace_on()) trace_counter_impl(name, values);
}

// A complete event ("ph":"X") from construction to destruction on this thread. `name` and `cat`
// must be string literals (they are kept as pointers).
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* cat) {
    if (trace_on()) begin(name, cat, {});
  }
  TraceSpan(const char* name, const char* cat, std::initializer_list<TraceArg> args) {
    if (trace_on()) begin(name, cat, args);
  }
  ~TraceSpan() {
    if (start_ns_ >= 0) end();
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  void begin(const char* name, const char* cat, std::initializer_list<TraceArg> args);
  void end();

  const char* name_ = nullptr;
  const char* cat_ = nullptr;
  int64_t start_ns_ = -1;
  int nargs_ = 0;
  TraceArg args_[kTraceMaxArgs];
};

}  // namespace deltafin
