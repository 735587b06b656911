// What this machine's drives can do, measured the way the engine reads: free space, and the
// O_DIRECT read bandwidth of several readers in large requests — of files that exist (a
// checkpoint's shards, a home's data files) or of a probe file written for the purpose. One
// facility for `doctor`, `place`, `bench` and the engine's drive probe, so each figure means the
// same everywhere. Also the small blocking-I/O helpers those writers share: a write that names
// its file when it fails, a folder synced after a rename, and work spread over threads of its own
// (I/O waits, not the compute pool).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace deltafin {

// The bytes an unprivileged writer may still put on the drive holding `dir` (none when `dir`
// cannot be examined).
std::optional<uint64_t> free_bytes(const std::string& dir);

// The best of `tries` reads of up to `bytes` from `files` (O_DIRECT where allowed, `readers`
// threads, `request` bytes per read): bytes/s, 0 when nothing could be read.
double probe_files(const std::vector<std::string>& files, int readers, uint64_t bytes, int tries,
                   uint64_t request = 8ull << 20);

// Writes a probe file of `bytes` in `dir` (a random name, created O_EXCL | O_NOFOLLOW, 0600),
// syncs it, drops it from the page cache and reads it back as probe_files does; the file is
// removed however the probe ends, so a full drive is never left fuller. Throws IoError naming
// `what` (e.g. "the home /mnt/b/h") and the cause: "its drive is full" when it is.
double probe_dir(const std::string& dir, const std::string& what, uint64_t bytes, int readers,
                 int tries, uint64_t request = 8ull << 20);

// Writes n bytes at `offset` (retrying interrupted and partial writes); throws IoError naming
// `path` ("the disk is full" for ENOSPC).
void write_all_at(int fd, const void* src, uint64_t n, uint64_t offset, const std::string& path);

// Syncs a folder, so a rename inside it survives a crash (best effort).
void sync_dir(const std::string& dir);

// Runs fn(i) for i in [0, n) on `threads` threads of its own (blocking I/O, not the compute
// pool); the first exception is rethrown once every thread has stopped.
void run_on_threads(size_t n, int threads, const std::function<void(size_t)>& fn);

}  // namespace deltafin
