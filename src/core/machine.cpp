// The machine facility (see machine.h).
#include "core/machine.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/file_io.h"
#include "core/sysinfo.h"
#include "core/weight_buffer.h"

namespace deltafin {

std::optional<uint64_t> free_bytes(const std::string& dir) {
  struct statvfs v {};
  if (::statvfs(dir.c_str(), &v) != 0) return std::nullopt;
  return static_cast<uint64_t>(v.f_bavail) * static_cast<uint64_t>(v.f_frsize);
}

double probe_files(const std::vector<std::string>& files, int readers, uint64_t bytes, int tries,
                   uint64_t request) {
  double best = 0;
  for (int t = 0; t < tries && !files.empty(); ++t)
    best = std::max(best, measure_disk_bandwidth(files, readers, bytes, request));
  return best;
}

double probe_dir(const std::string& dir, const std::string& what, uint64_t bytes, int readers,
                 int tries, uint64_t request) {
  bytes = std::max<uint64_t>(io_align_up(bytes), 1 << 20);
  const std::string path = with_random_suffix(dir + "/.deltafin-probe-");
  struct Remove {
    const std::string& path;
    int fd = -1;
    ~Remove() {
      if (fd >= 0) ::close(fd);
      ::unlink(path.c_str());
    }
  } remove{path};
  remove.fd = create_new_file(path, true);
  constexpr uint64_t kChunk = 4 << 20;  // aligned, as O_DIRECT writes need
  struct Buffer {
    uint8_t* p = alloc_weight_buffer(kChunk, "a probe file's buffer");
    ~Buffer() { std::free(p); }
  } buf;
  for (uint64_t i = 0; i < kChunk / 8; ++i) {
    const uint64_t v = (i + 1) * 0x9E3779B97F4A7C15ull;
    std::memcpy(buf.p + i * 8, &v, 8);
  }
  for (uint64_t at = 0; at < bytes; at += kChunk) {
    const int err = write_at(remove.fd, buf.p, std::min(kChunk, bytes - at), at);
    if (err == ENOSPC)
      fail_io("cannot probe {}: its drive is full (the probe file {} needs {} MiB; it was removed)",
              what, path, bytes >> 20);
    if (err != 0)
      fail_io("cannot probe {}: writing {} failed: {} (it was removed)", what, path,
              std::strerror(err));
  }
  if (::fdatasync(remove.fd) != 0)
    fail_io("cannot probe {}: syncing {} failed: {} (it was removed)", what, path,
            std::strerror(errno));
#if defined(POSIX_FADV_DONTNEED)
  ::posix_fadvise(remove.fd, 0, 0, POSIX_FADV_DONTNEED);
#endif
  ::close(remove.fd);
  remove.fd = -1;
  const double best = probe_files({path}, readers, bytes, tries, request);
  if (!(best > 0)) fail_io("cannot probe {}: the probe file could not be read back", what);
  return best;
}

void write_all_at(int fd, const void* src, uint64_t n, uint64_t offset, const std::string& path) {
  const int err = write_at(fd, src, n, offset);
  if (err == ENOSPC) fail_io("cannot write {}: the disk is full", path);
  if (err != 0) fail_io("cannot write {}: {}", path, std::strerror(err));
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void run_on_threads(size_t n, int threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr error;
  std::vector<std::thread> ts;
  for (int t = 0; t < std::max(1, threads); ++t) {
    ts.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> l(mu);
          if (!error) error = std::current_exception();
          next = n;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace deltafin
