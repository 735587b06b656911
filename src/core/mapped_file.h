// Read-only memory-mapped files. Checkpoint shards are mapped once; tensors are zero-copy views
// into the mapping. The descriptor stays open so the expert store can also pread() from it, and
// the file's identity (device, inode, size, mtime) is kept to detect a file replaced underneath.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deltafin {

struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

// Identity of the file at `path` now (throws IoError if it cannot be stat'ed).
FileIdentity file_identity(const std::string& path);

class MappedFile {
 public:
  MappedFile() = default;
  // Maps the whole file read-only. Throws IoError naming the path on failure.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  const FileIdentity& identity() const { return identity_; }

  // Hints for the kernel's page cache (no-ops where unsupported).
  void advise_random() const;
  void advise_willneed(uint64_t offset, uint64_t length) const;

 private:
  void reset();
  std::string path_;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  FileIdentity identity_;
};

// Reads a whole (small) file into a string. Throws IoError naming the path.
std::string read_file(const std::string& path);
// Reads a whole (small) file that must be a regular file: a config or index the engine trusts.
// A FIFO, device, socket or folder is refused with one IoError naming the path and what it is,
// without blocking (a FIFO is opened non-blocking, then refused).
std::string read_regular_file(const std::string& path);
// The check of read_regular_file without reading: IoError unless `path` is (or links to) a
// regular file.
void require_regular_file(const std::string& path);
// Refuses (InvalidArgument naming `path`) an output target that exists and is not a regular
// file: writers replace or truncate their target, and only a regular file may be replaced, so a
// folder, a device node, a FIFO, a socket or a symbolic link is left as it is.
void check_output_target(const std::string& path);
// Writes a file atomically: check_output_target, then write to a temporary in the same folder
// (an unpredictable name, created with O_EXCL | O_NOFOLLOW), fsync, rename. The file is 0600
// (core/file_io.h: what Deltafin writes is private). Errors name `path` (the file asked for), not
// the temporary.
void write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace deltafin
