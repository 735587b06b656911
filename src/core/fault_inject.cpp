// DELTAFIN_FAULT: parsing the spec once and deciding, per read or allocation, whether this one
// fails (see fault_inject.h for why the seam is built this way).
#include "core/fault_inject.h"

#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>

#include "core/log.h"
#include "core/test_hooks.h"

namespace deltafin {

namespace {

struct Spec {
  FaultKind kind = FaultKind::none;
  std::string match, arm;
  int64_t after = 0, count = 1;
  int delay_ms = 300;
};

bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 12) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

Spec parse_spec(const char* text) {
  Spec s;
  const std::string all = text;
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(';', start);
    if (end == std::string::npos) end = all.size();
    const std::string item = all.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq),
                      val = eq == std::string::npos ? "" : item.substr(eq + 1);
    int64_t n = 0;
    bool ok = true;
    if (key == "kind") {
      if (val == "eio")
        s.kind = FaultKind::eio;
      else if (val == "short")
        s.kind = FaultKind::short_read;
      else if (val == "slow")
        s.kind = FaultKind::slow;
      else if (val == "shrink")
        s.kind = FaultKind::shrink;
      else if (val == "oom")
        s.kind = FaultKind::oom;
      else if (val == "enospc")
        s.kind = FaultKind::enospc;
      else
        ok = false;
    } else if (key == "match") {
      s.match = val;
    } else if (key == "arm") {
      s.arm = val;
    } else if (key == "after" && parse_int(val, &n)) {
      s.after = n;
    } else if (key == "count" && parse_int(val, &n)) {
      s.count = n;
    } else if (key == "delay_ms" && parse_int(val, &n)) {
      s.delay_ms = static_cast<int>(n);
    } else {
      ok = false;
    }
    if (!ok) {
      log_warn(
          "DELTAFIN_FAULT: cannot use \"{}\" (expected kind=eio|short|slow|shrink|oom|enospc, "
          "match=, "
          "after=N, count=N, delay_ms=N, arm=PATH): no fault is injected",
          item);
      return Spec{};
    }
  }
  return s;
}

const Spec& spec() {
  static const Spec s = [] {
    const char* v = test_hook_env("DELTAFIN_FAULT");
    return v != nullptr ? parse_spec(v) : Spec{};
  }();
  return s;
}

std::atomic<int64_t> g_seen{0};

// Counts a matching event once armed; true when it is one of those to fail.
enum class Event { read, write, alloc };

bool hits(std::string_view description, Event e) {
  const Spec& s = spec();
  if ((s.kind == FaultKind::oom) != (e == Event::alloc)) return false;
  if ((s.kind == FaultKind::enospc) != (e == Event::write)) return false;
  if (!s.match.empty() && description.find(s.match) == std::string_view::npos) return false;
  if (!s.arm.empty()) {
    struct stat st {};
    if (::stat(s.arm.c_str(), &st) != 0) return false;
  }
  const int64_t k = g_seen.fetch_add(1) + 1;  // 1-based number of this matching event
  return k > s.after && (s.count == 0 || k <= s.after + s.count);
}

}  // namespace

namespace fault_detail {
const bool enabled = [] { return test_hook_env("DELTAFIN_FAULT") != nullptr; }();
}  // namespace fault_detail

ReadFault read_fault(std::string_view what, std::string_view path) {
  std::string description(what);
  description += ' ';
  description += path;
  if (!hits(description, Event::read)) return {};
  const Spec& s = spec();
  log_warn("DELTAFIN_FAULT: injecting a {} fault into the read of {}",
           s.kind == FaultKind::eio          ? "EIO"
           : s.kind == FaultKind::short_read ? "short-read"
           : s.kind == FaultKind::slow       ? "slow-read"
                                             : "shrunk-file",
           description);
  return {s.kind, s.delay_ms};
}

int write_fault(std::string_view what, std::string_view path) {
  std::string description(what);
  description += ' ';
  description += path;
  if (!hits(description, Event::write)) return 0;
  log_warn("DELTAFIN_FAULT: injecting ENOSPC (disk full) into the write of {}", description);
  return ENOSPC;
}

void alloc_fault_slow(std::string_view what) {
  if (!hits(what, Event::alloc)) return;
  log_warn("DELTAFIN_FAULT: injecting out-of-memory into the allocation of {}", what);
  throw std::bad_alloc();
}

}  // namespace deltafin
