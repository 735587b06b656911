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

}  // namespace deltafin
