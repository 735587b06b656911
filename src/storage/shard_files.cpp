#include "storage/shard_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/fault_inject.h"
#include "core/file_io.h"
#include "core/mapped_file.h"
#include "core/timer.h"
#include "storage/checkpoint.h"

namespace deltafin {

namespace {

// read_at, or the fault DELTAFIN_FAULT aims at this read (core/fault_inject.h). A short read
// keeps the 4 KiB grid so an O_DIRECT descriptor takes it; a shrunk file ends right here.
ReadResult read_or_fault(int fd, uint8_t* dst, uint64_t n, uint64_t offset, const std::string& what,
                         const std::string& path) {
  if (faults_enabled()) {
    const ReadFault f = read_fault(what, path);
    switch (f.kind) {
      case FaultKind::eio:
        return {0, EIO};
      case FaultKind::short_read:
        return read_at(fd, dst, io_align_down(n / 2), offset);
      case FaultKind::shrink:
        return {0, 0};
      case FaultKind::slow:
        std::this_thread::sleep_for(std::chrono::milliseconds(f.delay_ms));
        break;
      default:
        break;
    }
  }
  return read_at(fd, dst, n, offset);
}

}  // namespace

ShardFiles::ShardFiles(const Checkpoint& ck, bool direct_io)
    : ck_(ck), shards_(new Shard[ck.shards().size()]), n_(ck.shards().size()) {
  for (size_t i = 0; i < n_; ++i) {
    Shard& s = shards_[i];
    s.path = ck.shards()[i].path();
    bool direct_ok = direct_io;
    s.direct_fd = open_for_reading(s.path, direct_io, &direct_ok);
    s.buffered_fd = open_for_reading(s.path, false);
    s.use_direct.store(direct_io && direct_ok);
  }
}

ShardFiles::~ShardFiles() {
  for (size_t i = 0; i < n_; ++i) {
    ::close(shards_[i].direct_fd);
    ::close(shards_[i].buffered_fd);
  }
}

bool ShardFiles::direct() const {
  for (size_t i = 0; i < n_; ++i) {
    if (!shards_[i].use_direct.load()) return false;
  }
  return n_ > 0;
}

uint64_t ShardFiles::size(int shard) const {
  return ck_.shards()[static_cast<size_t>(shard)].size();
}

void ShardFiles::read_aligned(int shard, uint64_t offset, uint64_t length, uint8_t* dst,
                              uint64_t need, const std::string& what) const {
  const Shard& s = shards_[static_cast<size_t>(shard)];
  uint64_t got = 0;
  for (;;) {
    const bool direct = s.use_direct.load();
    const ReadResult rd = read_or_fault(direct ? s.direct_fd : s.buffered_fd, dst + got,
                                        length - got, offset + got, what, s.path);
    got += rd.bytes;
    if (rd.error == 0) break;  // all of it, or the end of the file
    if (rd.error == EINVAL && direct) {
      // The file system refused O_DIRECT after all: this shard reads buffered from now on.
      s.use_direct.store(false);
      continue;
    }
    fail_io("{} from {} at offset {}: {}", what, s.path, offset + got, std::strerror(rd.error));
  }
  if (got < need) {
    fail_io(
        "short read of {} from {}: {} of {} bytes at offset {} (the file is truncated or was "
        "replaced)",
        what, s.path, got, need, offset);
  }
}

void ShardFiles::read_buffered(int shard, uint64_t offset, uint64_t size, void* dst,
                               const std::string& what) const {
  const Shard& s = shards_[static_cast<size_t>(shard)];
  const ReadResult rd =
      read_or_fault(s.buffered_fd, static_cast<uint8_t*>(dst), size, offset, what, s.path);
  if (rd.error != 0)
    fail_io("{} from {} at offset {}: {}", what, s.path, offset + rd.bytes,
            std::strerror(rd.error));
  if (rd.bytes < size) fail_io("short read of {} from {}", what, s.path);
}

void ShardFiles::drop_buffered_pages() const {
#if defined(POSIX_FADV_DONTNEED)
  for (size_t i = 0; i < n_; ++i)
    ::posix_fadvise(shards_[i].buffered_fd, 0, 0, POSIX_FADV_DONTNEED);
#endif
}

void ShardFiles::check_identity() {
  std::lock_guard<std::mutex> l(check_mu_);
  const double now = now_seconds();
  if (now - last_check_ < 1.0) return;
  last_check_ = now;
  for (size_t i = 0; i < n_; ++i) {
    const std::string& p = shards_[i].path;
    FileIdentity id;
    try {
      id = file_identity(p);
    } catch (const IoError&) {
      fail_io("{} disappeared while running", p);
    }
    const FileIdentity& was = ck_.shards()[i].identity();
    if (!(id == was)) {
      fail_io(
          "{} was replaced or changed while running (size {} -> {}); restart to use the new file",
          p, was.size, id.size);
    }
  }
}

}  // namespace deltafin
