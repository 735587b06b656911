// Read-only memory-mapped files. Checkpoint shards are mapped once; tensors are zero-copy views
// into the mapping. The descriptor stays open so the expert store can also pread() from it, and
// the file's identity (device, inode, size, mtime) is kept to detect a file replaced underneath.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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
// Writes a file atomically: write to a temporary in the same folder, fsync, rename.
void write_file_atomic(const std::string& path, const std::string& contents);

}  // namespace deltafin
