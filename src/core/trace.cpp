// The tracer behind core/trace.h: per-thread event buffers in a registry that owns them, one
// global event count for the cap, and the one writer that turns the buffers into the Trace Event
// Format's JSON object form at the end. See trace.h for why.
#include "core/trace.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"

namespace deltafin {
namespace trace_detail {
std::atomic<bool> g_trace_on{false};
}
namespace {

constexpr int64_t kDefaultTraceCap = 2'000'000;
constexpr size_t kTraceRecentCap = 32768;

// The two sinks; g_trace_on is their union, recomputed under g_trace_flags_mu.
std::atomic<bool> g_trace_file_on{false};
std::atomic<int> g_trace_watchers{0};
std::mutex g_trace_flags_mu;
void trace_update_on() {
  trace_detail::g_trace_on.store(g_trace_file_on.load() || g_trace_watchers.load() > 0,
                                 std::memory_order_release);
}

struct TraceEvent {
  const char* name;
  const char* cat;
  char ph;  // 'X' or 'C'
  int nargs;
  int64_t ts_ns, dur_ns;
  TraceArg args[kTraceMaxArgs];
};

// Events in fixed chunks, never moved: a growing vector would copy every event at each doubling
// and touch twice the fresh pages. Each chunk is mapped with its pages populated in one call
// rather than faulted in page by page while spans append (fresh memory is most of an event's cost
// on the virtual machine of docs/PERFORMANCE.md, "Tracing").
constexpr size_t kTraceChunkEvents = 4096;
struct TraceChunkUnmap {
  void operator()(TraceEvent* p) const { ::munmap(p, kTraceChunkEvents * sizeof(TraceEvent)); }
};
using TraceChunk = std::unique_ptr<TraceEvent[], TraceChunkUnmap>;
TraceChunk trace_new_chunk() {
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_POPULATE
  flags |= MAP_POPULATE;
#endif
  void* p =
      ::mmap(nullptr, kTraceChunkEvents * sizeof(TraceEvent), PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) return nullptr;  // out of memory: the event is dropped
  return TraceChunk(static_cast<TraceEvent*>(p));
}
struct TraceThreadBuffer {
  std::mutex mu;  // contended only by the final write
  int tid = 0;
  std::string name;
  std::vector<TraceChunk> chunks;
  size_t used = 0;  // events in the last chunk

  bool push(const TraceEvent& e) {
    if (chunks.empty() || used == kTraceChunkEvents) {
      TraceChunk c = trace_new_chunk();
      if (!c) return false;
      chunks.push_back(std::move(c));
      used = 0;
    }
    chunks.back()[used++] = e;
    return true;
  }
  void clear() {
    chunks.clear();
    used = 0;
  }
  template <typename F>
  void for_each(F&& f) const {
    for (size_t c = 0; c < chunks.size(); ++c) {
      const size_t n = c + 1 == chunks.size() ? used : kTraceChunkEvents;
      for (size_t i = 0; i < n; ++i) f(chunks[c][i]);
    }
  }
};

struct TraceRegistry {
  std::mutex mu;
  std::vector<std::unique_ptr<TraceThreadBuffer>> buffers;
  std::string path, tmp;
  int fd = -1;
  int64_t cap = kDefaultTraceCap;
  std::atomic<int64_t> count{0}, dropped{0};
  // Fixed for the process: the file's events are written relative to file_start_ns.
  const std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();
  int64_t file_start_ns = 0;
};

// The recent window's ring: the last kTraceRecentCap spans of all threads.
struct TraceRecentRing {
  std::mutex mu;
  std::vector<TraceRecentSpan> ring;  // allocated by the first watcher, freed by the last
  size_t next = 0;
  bool full = false;
};
TraceRecentRing& trace_recent_ring() {
  static TraceRecentRing* r = new TraceRecentRing;  // never destroyed, like the registry
  return *r;
}

TraceRegistry& trace_registry() {
  static TraceRegistry* r = new TraceRegistry;  // never destroyed: threads may record at exit
  return *r;
}

// The calling thread's name until its buffer exists (then the buffer holds it).
thread_local char t_trace_name[48] = "";
thread_local TraceThreadBuffer* t_trace_buffer = nullptr;

TraceThreadBuffer& trace_buffer() {
  if (t_trace_buffer != nullptr) return *t_trace_buffer;
  TraceRegistry& r = trace_registry();
  std::lock_guard<std::mutex> l(r.mu);
  auto b = std::make_unique<TraceThreadBuffer>();
  b->tid = static_cast<int>(r.buffers.size()) + 1;
  b->name = t_trace_name[0] != '\0' ? t_trace_name : fmt::format("thread {}", b->tid);
  t_trace_buffer = b.get();
  r.buffers.push_back(std::move(b));
  return *t_trace_buffer;
}

int64_t trace_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              trace_registry().epoch)
      .count();
}

void trace_record_recent(const TraceEvent& e) {
  const int tid = trace_buffer().tid;
  TraceRecentRing& q = trace_recent_ring();
  std::lock_guard<std::mutex> l(q.mu);
  if (q.ring.empty()) return;  // the last watcher left meanwhile
  TraceRecentSpan& s = q.ring[q.next];
  s.tid = tid;
  s.name = e.name;
  s.cat = e.cat;
  s.ts_ns = e.ts_ns;
  s.dur_ns = e.dur_ns;
  s.nargs = e.nargs;
  std::copy(e.args, e.args + e.nargs, s.args);
  if (++q.next == q.ring.size()) {
    q.next = 0;
    q.full = true;
  }
}

void trace_record(const TraceEvent& e) {
  if (e.ph == 'X' && g_trace_watchers.load(std::memory_order_relaxed) > 0) trace_record_recent(e);
  if (!g_trace_file_on.load(std::memory_order_relaxed)) return;
  TraceRegistry& r = trace_registry();
  if (r.count.fetch_add(1, std::memory_order_relaxed) >= r.cap) {
    r.dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  TraceThreadBuffer& b = trace_buffer();
  std::lock_guard<std::mutex> l(b.mu);
  if (!b.push(e)) r.dropped.fetch_add(1, std::memory_order_relaxed);
}

// Names and keys are the program's own literals and thread names; escaped all the same.
void trace_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(ch));
    } else {
      out += ch;
    }
  }
  out += '"';
}

void trace_write_all(int fd, const std::string& text, uint64_t& offset, const std::string& path) {
  if (const int err = write_at(fd, text.data(), text.size(), offset); err != 0)
    fail_io("cannot write the trace {}: {}", path, std::strerror(err));
  offset += text.size();
}

void trace_append_event(std::string& out, TraceEvent e, int tid, int64_t start_ns) {
  e.ts_ns -= start_ns;
  out += "{\"name\":";
  trace_json_string(out, e.name);
  if (e.ph == 'X') {
    out += ",\"cat\":";
    trace_json_string(out, e.cat);
    // Microseconds with nanosecond decimals: the format's unit, no rounding of nesting.
    out += fmt::format(",\"ph\":\"X\",\"ts\":{}.{:03},\"dur\":{}.{:03}", e.ts_ns / 1000,
                       e.ts_ns % 1000, e.dur_ns / 1000, e.dur_ns % 1000);
  } else {
    out += fmt::format(",\"ph\":\"C\",\"ts\":{}.{:03}", e.ts_ns / 1000, e.ts_ns % 1000);
  }
  out += fmt::format(",\"pid\":1,\"tid\":{},\"args\":{{", tid);
  for (int i = 0; i < e.nargs; ++i) {
    if (i > 0) out += ',';
    trace_json_string(out, e.args[i].key);
    out += fmt::format(":{}", e.args[i].value);
  }
  out += "}}";
}

}  // namespace

void trace_start(const std::string& path, int64_t cap) {
  TraceRegistry& r = trace_registry();
  std::lock_guard<std::mutex> l(r.mu);
  if (r.fd >= 0) fail_io("a trace is already being recorded into {}", r.path);
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail_io("{}: it is {} (expected a file to write)", path, file_kind(st.st_mode));
  const std::string tmp = with_random_suffix(path + ".tmp-");
  try {
    r.fd = create_new_file(tmp, false);
  } catch (const IoError& e) {
    fail_io("{}: cannot create the trace file ({})", path, e.what());
  }
  r.path = path;
  r.tmp = tmp;
  r.cap = cap > 0 ? cap : kDefaultTraceCap;
  r.count = 0;
  r.dropped = 0;
  for (auto& b : r.buffers) {
    std::lock_guard<std::mutex> bl(b->mu);
    b->clear();
  }
  r.file_start_ns = trace_now_ns();
  std::lock_guard<std::mutex> fl(g_trace_flags_mu);
  g_trace_file_on.store(true);
  trace_update_on();
}

namespace {
void trace_file_off() {
  std::lock_guard<std::mutex> fl(g_trace_flags_mu);
  g_trace_file_on.store(false);
  trace_update_on();
}
}  // namespace

void trace_abandon() {
  TraceRegistry& r = trace_registry();
  trace_file_off();
  std::lock_guard<std::mutex> l(r.mu);
  if (r.fd < 0) return;
  ::close(r.fd);
  ::unlink(r.tmp.c_str());
  r.fd = -1;
}

int64_t trace_finish() {
  TraceRegistry& r = trace_registry();
  trace_file_off();
  std::lock_guard<std::mutex> l(r.mu);
  if (r.fd < 0) return 0;
  const int fd = r.fd;
  r.fd = -1;
  int64_t written = 0;
  try {
    uint64_t offset = 0;
    std::string out = "{\"traceEvents\":[\n";
    bool first = true;
    for (auto& b : r.buffers) {
      std::lock_guard<std::mutex> bl(b->mu);
      if (!first) out += ",\n";
      first = false;
      out += fmt::format("{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{},\"args\":{{",
                         b->tid);
      out += "\"name\":";
      trace_json_string(out, b->name);
      out += "}}";
      b->for_each([&](const TraceEvent& e) {
        // A span the recent window began before the file did: not part of the file's time.
        if (e.ts_ns < r.file_start_ns) return;
        out += ",\n";
        trace_append_event(out, e, b->tid, r.file_start_ns);
        ++written;
        if (out.size() > (1u << 20)) {
          trace_write_all(fd, out, offset, r.path);
          out.clear();
        }
      });
    }
    const int64_t dropped = r.dropped.load();
    out += fmt::format(
        "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"producer\":\"deltafin {}\","
        "\"events\":{},\"dropped_events\":{},\"event_cap\":{}}}}}\n",
        DELTAFIN_VERSION, written, dropped, r.cap);
    trace_write_all(fd, out, offset, r.path);
    if (::fsync(fd) != 0) fail_io("cannot write the trace {}: {}", r.path, std::strerror(errno));
    if (::close(fd) != 0) {
      ::unlink(r.tmp.c_str());
      fail_io("cannot write the trace {}: {}", r.path, std::strerror(errno));
    }
  } catch (...) {
    ::close(fd);
    ::unlink(r.tmp.c_str());
    throw;
  }
  if (::rename(r.tmp.c_str(), r.path.c_str()) != 0) {
    const int err = errno;
    ::unlink(r.tmp.c_str());
    fail_io("cannot write the trace {}: {}", r.path, std::strerror(err));
  }
  return written;
}

void trace_recent_watch(bool on) {
  TraceRecentRing& q = trace_recent_ring();
  std::lock_guard<std::mutex> fl(g_trace_flags_mu);
  const int before = g_trace_watchers.load();
  const int after = std::max(0, before + (on ? 1 : -1));
  if (before == 0 && after > 0) {
    std::lock_guard<std::mutex> l(q.mu);
    q.ring.assign(kTraceRecentCap, TraceRecentSpan{});
    q.next = 0;
    q.full = false;
  }
  g_trace_watchers.store(after);
  trace_update_on();
  if (before > 0 && after == 0) {
    std::lock_guard<std::mutex> l(q.mu);
    std::vector<TraceRecentSpan>().swap(q.ring);
  }
}

TraceRecent trace_recent(int passes, size_t max_spans) {
  TraceRecent out;
  std::vector<TraceRecentSpan> spans;
  {
    TraceRecentRing& q = trace_recent_ring();
    std::lock_guard<std::mutex> l(q.mu);
    const size_t n = q.full ? q.ring.size() : q.next;
    spans.assign(q.ring.begin(), q.ring.begin() + static_cast<std::ptrdiff_t>(n));
  }
  // The last `passes` passes by their end; the window runs from the earliest of their starts.
  std::vector<const TraceRecentSpan*> pass_spans;
  for (const auto& s : spans) {
    if (std::strcmp(s.name, "pass") == 0) pass_spans.push_back(&s);
  }
  if (pass_spans.empty() || passes <= 0) return out;
  std::sort(pass_spans.begin(), pass_spans.end(), [](const auto* a, const auto* b) {
    return a->ts_ns + a->dur_ns > b->ts_ns + b->dur_ns;
  });
  pass_spans.resize(std::min(pass_spans.size(), static_cast<size_t>(passes)));
  int64_t start = pass_spans.front()->ts_ns, end = pass_spans.front()->ts_ns;
  for (const auto* p : pass_spans) {
    start = std::min(start, p->ts_ns);
    end = std::max(end, p->ts_ns + p->dur_ns);
  }
  out.passes = static_cast<int>(pass_spans.size());
  out.start_ns = start;
  out.duration_ns = end - start;
  for (const auto& s : spans) {
    if (s.ts_ns < end && s.ts_ns + s.dur_ns > start) out.spans.push_back(s);
  }
  if (out.spans.size() > max_spans) {
    std::stable_sort(out.spans.begin(), out.spans.end(),
                     [](const auto& a, const auto& b) { return a.dur_ns > b.dur_ns; });
    out.omitted = static_cast<int64_t>(out.spans.size() - max_spans);
    out.spans.resize(max_spans);
  }
  std::sort(out.spans.begin(), out.spans.end(),
            [](const auto& a, const auto& b) { return a.ts_ns < b.ts_ns; });
  std::vector<int> tids;
  for (auto& s : out.spans) {
    s.ts_ns -= start;
    tids.push_back(s.tid);
  }
  std::sort(tids.begin(), tids.end());
  tids.erase(std::unique(tids.begin(), tids.end()), tids.end());
  TraceRegistry& r = trace_registry();
  std::lock_guard<std::mutex> l(r.mu);
  for (const int tid : tids) {
    const auto& b = r.buffers[static_cast<size_t>(tid - 1)];
    std::lock_guard<std::mutex> bl(b->mu);
    out.threads.emplace_back(tid, b->name);
  }
  return out;
}

void trace_thread_name(const char* base, int index) {
  if (index >= 0) {
    std::snprintf(t_trace_name, sizeof t_trace_name, "%s %d", base, index);
  } else {
    std::snprintf(t_trace_name, sizeof t_trace_name, "%s", base);
  }
  if (t_trace_buffer != nullptr) {
    std::lock_guard<std::mutex> l(t_trace_buffer->mu);
    t_trace_buffer->name = t_trace_name;
  }
}

void trace_counter_impl(const char* name, std::initializer_list<TraceArg> values) {
  TraceEvent e{};
  e.name = name;
  e.cat = "counter";
  e.ph = 'C';
  e.ts_ns = trace_now_ns();
  for (const TraceArg& a : values) {
    if (e.nargs == kTraceMaxArgs) break;
    e.args[e.nargs++] = a;
  }
  trace_record(e);
}

void TraceSpan::begin(const char* name, const char* cat, std::initializer_list<TraceArg> args) {
  name_ = name;
  cat_ = cat;
  for (const TraceArg& a : args) {
    if (nargs_ == kTraceMaxArgs) break;
    args_[nargs_++] = a;
  }
  start_ns_ = trace_now_ns();
}

void TraceSpan::end() {
  TraceEvent e{};
  e.name = name_;
  e.cat = cat_;
  e.ph = 'X';
  e.ts_ns = start_ns_;
  e.dur_ns = trace_now_ns() - start_ns_;
  e.nargs = nargs_;
  std::copy(args_, args_ + nargs_, e.args);
  trace_record(e);
}

}  // namespace deltafin
