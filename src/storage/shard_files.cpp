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

DirectFile::DirectFile(std::string path, bool direct_io) : path_(std::move(path)) {
  bool direct_ok = direct_io;
  direct_fd_ = open_for_reading(path_, direct_io, &direct_ok);
  try {
    buffered_fd_ = open_for_reading(path_, false);
  } catch (...) {
    ::close(direct_fd_);
    throw;
  }
  use_direct_.store(direct_io && direct_ok);
}

DirectFile::~DirectFile() {
  ::close(direct_fd_);
  ::close(buffered_fd_);
}

void DirectFile::read_aligned(uint64_t offset, uint64_t length, uint8_t* dst, uint64_t need,
                              const std::string& what) const {
  uint64_t got = 0;
  for (;;) {
    const bool direct = use_direct_.load();
    const ReadResult rd = read_or_fault(direct ? direct_fd_ : buffered_fd_, dst + got, length - got,
                                        offset + got, what, path_);
    got += rd.bytes;
    if (rd.error == 0) break;  // all of it, or the end of the file
    if (rd.error == EINVAL && direct) {
      // The file system refused O_DIRECT after all: this file reads buffered from now on.
      use_direct_.store(false);
      continue;
    }
    fail_io("{} from {} at offset {}: {}", what, path_, offset + got, std::strerror(rd.error));
  }
  if (got < need) {
    fail_io(
        "short read of {} from {}: {} of {} bytes at offset {} (the file is truncated or was "
        "replaced)",
        what, path_, got, need, offset);
  }
}

void DirectFile::read_buffered(uint64_t offset, uint64_t size, void* dst,
                               const std::string& what) const {
  const ReadResult rd =
      read_or_fault(buffered_fd_, static_cast<uint8_t*>(dst), size, offset, what, path_);
  if (rd.error != 0)
    fail_io("{} from {} at offset {}: {}", what, path_, offset + rd.bytes, std::strerror(rd.error));
  if (rd.bytes < size) fail_io("short read of {} from {}", what, path_);
}

void DirectFile::drop_buffered_pages() const {
#if defined(POSIX_FADV_DONTNEED)
  ::posix_fadvise(buffered_fd_, 0, 0, POSIX_FADV_DONTNEED);
#endif
}

ShardFiles::ShardFiles(const Checkpoint& ck, bool direct_io) : ck_(ck) {
  for (const auto& shard : ck.shards())
    files_.push_back(std::make_unique<DirectFile>(shard.path(), direct_io));
}

bool ShardFiles::direct() const {
  for (const auto& f : files_) {
    if (!f->direct()) return false;
  }
  return !files_.empty();
}

uint64_t ShardFiles::size(int shard) const {
  return ck_.shards()[static_cast<size_t>(shard)].size();
}

void ShardFiles::drop_buffered_pages() const {
  for (const auto& f : files_) f->drop_buffered_pages();
}

void ShardFiles::check_identity() {
  std::lock_guard<std::mutex> l(check_mu_);
  const double now = now_seconds();
  if (now - last_check_ < 1.0) return;
  last_check_ = now;
  for (size_t i = 0; i < files_.size(); ++i) {
    const std::string& p = files_[i]->path();
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
