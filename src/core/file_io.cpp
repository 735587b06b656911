#include "core/file_io.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

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

namespace {

// What a file that is not a regular file is, for messages.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

// Turns O_DIRECT on for an open descriptor (F_NOCACHE on macOS); false where the file system
// refuses it. Done after the open, so a file system that refuses O_DIRECT never sees an open
// that created a file and then failed (tmpfs did, before Linux 6.6), and the exclusive create is
// the only create.
bool set_direct(int fd) {
#if defined(O_DIRECT)
  const int fl = ::fcntl(fd, F_GETFL);
  return fl >= 0 && ::fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
#elif defined(__APPLE__)
  return ::fcntl(fd, F_NOCACHE, 1) == 0;
#else
  (void)fd;
  return false;
#endif
}

}  // namespace

int open_regular_for_reading(const std::string& path, bool direct, bool* direct_ok) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0 && errno == ELOOP)
    fail_io("{} is a symbolic link (expected a regular file; links are not followed)", path);
  if (fd < 0) fail_io("cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail_io("cannot stat {}: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail_io("{} is {} (expected a regular file)", path, kind_of(st.st_mode));
  }
  if (direct && !set_direct(fd) && direct_ok != nullptr) *direct_ok = false;
  if (!direct && direct_ok != nullptr) *direct_ok = false;
  return fd;
}

int create_new_file(const std::string& path, bool direct, bool* direct_ok) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST)
    fail_io("cannot create {}: it exists (expected a new file; nothing was written to it)", path);
  if (fd < 0) fail_io("cannot create {}: {}", path, std::strerror(errno));
  if (direct && !set_direct(fd) && direct_ok != nullptr) *direct_ok = false;
  if (!direct && direct_ok != nullptr) *direct_ok = false;
  return fd;
}

std::string with_random_suffix(const std::string& prefix) {
  uint64_t r = 0;
  if (::getentropy(&r, sizeof r) != 0) {
    std::random_device dev;  // getentropy refused (an old kernel): the C++ library's source
    r = (static_cast<uint64_t>(dev()) << 32) ^ dev();
  }
  static const char* kHex = "0123456789abcdef";
  std::string out = prefix;
  for (int i = 15; i >= 0; --i) out += kHex[(r >> (4 * i)) & 15];
  return out;
}

void make_private_dirs(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path built;
  for (const auto& part : fs::path(dir).lexically_normal()) {
    built /= part;
    if (part.empty() || part == "/" || part == "." || fs::is_directory(built, ec)) continue;
    if (::mkdir(built.c_str(), 0700) == 0 || errno == EEXIST) {
      if (!fs::is_directory(built, ec))
        fail_io("cannot create the folder {}: {} exists and is not a folder", dir, built.string());
      continue;
    }
    fail_io("cannot create the folder {}: {}", built.string(), std::strerror(errno));
  }
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
