// Positioned reads of checkpoint shards, shared by the trunk streamer, the expert store and the
// disk probe, and positioned writes of the prefix store's snapshot files: opening with O_DIRECT
// where the platform and file system allow it (falling back to buffered reads), 4 KiB alignment for
// O_DIRECT ranges, and a read loop that survives EINTR and partial reads.
//
// Files Deltafin creates are private and never land on something already there (SECURITY.md,
// "Files Deltafin writes"): a new file is created exclusively (O_EXCL | O_NOFOLLOW: an existing
// file, a planted symbolic link or a FIFO fails the open instead of being written through) with
// mode 0600, under an unpredictable name when it is a temporary (64 random bits, so nobody can
// plant the name in advance), and folders Deltafin creates are 0700. The helpers below are the
// one place these rules are spelled out.
#pragma once

#include <cstdint>
#include <string>

namespace deltafin {

constexpr uint64_t kIoAlign = 4096;  // O_DIRECT offsets, lengths and buffers are multiples of this
constexpr uint64_t io_align_down(uint64_t x) {
  return x / kIoAlign * kIoAlign;
}
constexpr uint64_t io_align_up(uint64_t x) {
  return (x + kIoAlign - 1) / kIoAlign * kIoAlign;
}

// Opens `path` read-only, with O_DIRECT (F_NOCACHE on macOS) when `direct` is true and the
// platform accepts it; `*direct_ok` is cleared when it had to fall back to a buffered descriptor.
// Throws IoError naming the path when the file cannot be opened at all.
int open_for_reading(const std::string& path, bool direct, bool* direct_ok = nullptr);

struct ReadResult {
  uint64_t bytes = 0;  // read before the end of the file, an error, or n
  int error = 0;       // errno of a failed read (0: none)
};
// Reads up to n bytes at `offset` into dst, retrying interrupted and partial reads; stops early
// at the end of the file or at the first error.
ReadResult read_at(int fd, void* dst, uint64_t n, uint64_t offset);

// Opens `path` read-only like open_for_reading, but only a regular file and never through a
// symbolic link: O_NOFOLLOW | O_NONBLOCK (a FIFO neither blocks the open nor is read), then
// fstat. Throws IoError naming the path and what it is ("... is a FIFO (expected a regular
// file)").
int open_regular_for_reading(const std::string& path, bool direct, bool* direct_ok = nullptr);

// Creates `path`, which must not exist, for writing: O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600,
// with O_DIRECT where the platform and file system accept it (`*direct_ok` cleared when it fell
// back). Throws IoError naming the path (EEXIST: "... exists (expected a new file)").
int create_new_file(const std::string& path, bool direct, bool* direct_ok = nullptr);
// `prefix` followed by 16 random hex digits (getentropy): the name of a temporary file nobody can
// predict, e.g. with_random_suffix(path + ".tmp-").
std::string with_random_suffix(const std::string& prefix);
// Creates `dir` and every missing folder above it with mode 0700 (folders that exist keep
// theirs). Throws IoError naming the folder that could not be made or that is not a folder.
void make_private_dirs(const std::string& dir);
// Writes n bytes at `offset`, retrying interrupted and partial writes; returns 0 or the errno of
// the write that failed (ENOSPC: the disk is full). With O_DIRECT, src, n and offset are
// multiples of kIoAlign.
int write_at(int fd, const void* src, uint64_t n, uint64_t offset);

}  // namespace deltafin
