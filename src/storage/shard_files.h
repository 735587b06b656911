// The one way bytes come out of checkpoint shards when they are not mapped: the trunk streamer,
// the expert store and the router roster all read through ShardFiles.
//
// Why it is built this way:
//  * Each shard is opened twice (DirectFile): once with O_DIRECT (when asked and allowed), for
//    the large aligned reads of trunk units and experts (the budget is honest: the page cache
//    does not hold a second copy), and once buffered, for small exact reads (embedding rows,
//    routers).
//  * A file system may accept O_DIRECT at open and still refuse a read with EINVAL. The shard
//    then switches, for good, to its buffered descriptor, which is already open: no descriptor
//    is ever closed or replaced while another reader may be using it, so concurrent readers
//    need no lock (the choice is one atomic flag per shard).
//  * Aligned reads widen to the 4 KiB grid; a read that ends before the bytes it needs (file
//    truncated or replaced) is an IoError naming the file, so the request that needed them
//    fails and nothing else does. `check_identity` notices a shard replaced under a running
//    process (device, inode, size, mtime), at most once a second.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace deltafin {

class Checkpoint;

// One file opened for aligned reads: the O_DIRECT descriptor (when asked and allowed) and the
// buffered one, with the switch to buffered reads for good on EINVAL. Shards and the expert
// copies in homes (storage/home.h) read through it.
class DirectFile {
 public:
  DirectFile(std::string path, bool direct_io);
  ~DirectFile();
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;

  // Reads `length` bytes at `offset` into `dst`; offset, length and dst are on the 4 KiB grid
  // for O_DIRECT. Bytes past the end of the file are left untouched. Throws IoError (the message
  // starts with `what`) when a read fails or ends before `need` bytes.
  void read_aligned(uint64_t offset, uint64_t length, uint8_t* dst, uint64_t need,
                    const std::string& what) const;
  // An exact read through the page cache.
  void read_buffered(uint64_t offset, uint64_t size, void* dst, const std::string& what) const;
  void drop_buffered_pages() const;
  bool direct() const { return use_direct_.load(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int direct_fd_ = -1;  // O_DIRECT descriptor, or the buffered one when refused at open
  int buffered_fd_ = -1;
  mutable std::atomic<bool> use_direct_{false};
};

class ShardFiles {
 public:
  ShardFiles(const Checkpoint& ck, bool direct_io);
  ShardFiles(const ShardFiles&) = delete;
  ShardFiles& operator=(const ShardFiles&) = delete;

  // DirectFile::read_aligned of `shard`.
  void read_aligned(int shard, uint64_t offset, uint64_t length, uint8_t* dst, uint64_t need,
                    const std::string& what) const {
    files_[static_cast<size_t>(shard)]->read_aligned(offset, length, dst, need, what);
  }
  // An exact read through the page cache (small reads: embedding rows, routers).
  void read_buffered(int shard, uint64_t offset, uint64_t size, void* dst,
                     const std::string& what) const {
    files_[static_cast<size_t>(shard)]->read_buffered(offset, size, dst, what);
  }
  // Drops the page-cache pages that buffered reads brought in.
  void drop_buffered_pages() const;
  // Throws IoError when a shard disappeared or was replaced since the checkpoint was opened.
  // Checks the files at most once a second (the first call always checks).
  void check_identity();

  // True while every shard still reads with O_DIRECT.
  bool direct() const;
  const std::string& path(int shard) const { return files_[static_cast<size_t>(shard)]->path(); }
  uint64_t size(int shard) const;

 private:
  const Checkpoint& ck_;
  std::vector<std::unique_ptr<DirectFile>> files_;
  std::mutex check_mu_;
  double last_check_ = -1e9;
};

}  // namespace deltafin
