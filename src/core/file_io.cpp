#include "core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace deltafin {

int open_for_reading(const std::string& path, bool direct, bool* direct_ok) {
  int fd = -1;
#ifdef O_DIRECT
  if (direct) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
#endif
  if (fd < 0) {
    if (direct_ok != nullptr) *direct_ok = false;
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (fd < 0) fail_io("cannot open {}: {}", path, std::strerror(errno));
#if defined(__APPLE__)
  if (direct) ::fcntl(fd, F_NOCACHE, 1);
#endif
  return fd;
}

ReadResult read_at(int fd, void* dst, uint64_t n, uint64_t offset) {
  ReadResult r;
  auto* p = static_cast<uint8_t*>(dst);
  while (r.bytes < n) {
    const ssize_t got = ::pread(fd, p + r.bytes, n - r.bytes, static_cast<off_t>(offset + r.bytes));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      r.error = errno;
      break;
    }
    if (got == 0) break;  // end of file
    r.bytes += static_cast<uint64_t>(got);
  }
  return r;
}

int open_for_writing(const std::string& path, bool direct, bool* direct_ok) {
  int fd = -1;
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
#ifdef O_DIRECT
  if (direct) fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
#endif
  if (fd < 0) {
    if (direct_ok != nullptr) *direct_ok = false;
    fd = ::open(path.c_str(), flags, 0644);
  }
  if (fd < 0) fail_io("cannot create {}: {}", path, std::strerror(errno));
#if defined(__APPLE__)
  if (direct) ::fcntl(fd, F_NOCACHE, 1);
#endif
  return fd;
}

int write_at(int fd, const void* src, uint64_t n, uint64_t offset) {
  const auto* p = static_cast<const uint8_t*>(src);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t put = ::pwrite(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) return errno;
    if (put == 0) return EIO;
    done += static_cast<uint64_t>(put);
  }
  return 0;
}

}  // namespace deltafin
