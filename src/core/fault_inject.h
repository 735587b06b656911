// Fault injection for tests: make a chosen checkpoint read fail with EIO, return short, be slow,
// or see its file end early (shrunk), and make a chosen allocation of a sequence's state run out
// of memory — without LD_PRELOAD and without touching the disk.
//
// Why it is built this way:
//  * The seam sits where every checkpoint byte outside a mapping comes from: ShardFiles calls
//    read_fault() before each read (trunk streamer, expert store, routers, embedding rows), and
//    State's constructor calls alloc_fault(). The tests drive the real `deltafin serve` binary,
//    so the fault is chosen from outside through one environment variable, DELTAFIN_FAULT (a
//    test hook release builds keep on purpose: core/test_hooks.h, SECURITY.md "Test hooks").
//  * Zero cost in normal runs: the variable is read once; when it is unset, faults_enabled() is
//    a load of a constant bool and nothing else happens (no counters, no locks, no syscalls).
//  * Deterministic: a fault hits the reads (or allocations) numbered after+1 .. after+count among
//    those whose description matches, counted only once the fault is armed. Arming by a file
//    (`arm=PATH`: counting starts once PATH exists) lets a test load the model cleanly, wait
//    until the server is ready, and then aim at exactly the next request's reads.
//
// DELTAFIN_FAULT is `;`-separated key=value pairs:
//   kind=eio|short|slow|shrink|oom|enospc   what happens (oom: alloc_fault throws std::bad_alloc;
//                  enospc fails writes, and only writes: write_fault, the prefix store's files)
//   match=TEXT     only reads whose "WHAT PATH" (or allocation name) contains TEXT (default: all)
//   after=N        let N matching events through first (default 0)
//   count=N        how many events fail (default 1; 0 = every one from then on)
//   delay_ms=N     slow: the sleep before the read (default 300)
//   arm=PATH       count nothing until PATH exists (checked on each matching event)
// A malformed value is reported once on stderr and no fault is injected.
#pragma once

#include <cstdint>
#include <string_view>

namespace deltafin {

enum class FaultKind { none, eio, short_read, slow, shrink, oom, enospc };

struct ReadFault {
  FaultKind kind = FaultKind::none;
  int delay_ms = 0;
};

namespace fault_detail {
extern const bool enabled;  // DELTAFIN_FAULT was set (read once at start-up)
}
inline bool faults_enabled() {
  return fault_detail::enabled;
}

// The fault for the next read of `what` (a tensor or expert description) from `path`; counts the
// read. Only call when faults_enabled().
ReadFault read_fault(std::string_view what, std::string_view path);

// The errno to fail the next write of `what` to `path` with (ENOSPC), or 0; counts the
// write. Only call when faults_enabled().
int write_fault(std::string_view what, std::string_view path);

// Throws std::bad_alloc when an oom fault is aimed at this allocation (named `what`).
void alloc_fault_slow(std::string_view what);
inline void alloc_fault(std::string_view what) {
  if (faults_enabled()) alloc_fault_slow(what);
}

}  // namespace deltafin
