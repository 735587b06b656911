// The download engine (fetch.h). All file system work below DIR goes through descriptors
// (openat/renameat/unlinkat with O_NOFOLLOW) rather than paths, so a symbolic link planted in
// DIR/.deltafin-pull or along a target's folders is never followed; the hub's strings only ever
// reach file names through check_repo_path (targets) or not at all (partial files).
#include "pull/fetch.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/machine.h"
#include "core/timer.h"
#include "core/units.h"

namespace deltafin::pull {

namespace fs = std::filesystem;

namespace {

std::string hex_of(const unsigned char* d, unsigned n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < n; ++i) {
    s += digits[d[i] >> 4];
    s += digits[d[i] & 15];
  }
  return s;
}

// The hash of an open file's bytes (from offset 0 to its end); `path` names it in errors.
std::string digest_fd(int fd, bool git_blob, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    fail("{}: cannot read it to check its hash: {}", path, std::strerror(errno));
  FileHasher h(git_blob, static_cast<uint64_t>(st.st_size));
  std::vector<unsigned char> buf(4u << 20);
  off_t at = 0;
  for (;;) {
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("{}: read failed while checking its hash: {}", path, std::strerror(errno));
    if (n == 0) break;
    h.update(buf.data(), static_cast<size_t>(n));
    at += n;
  }
  return h.hex();
}

std::string digest_file(const std::string& path, bool git_blob) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot read it to check its hash: {}", path, std::strerror(errno));
  try {
    std::string h = digest_fd(fd, git_blob, path);
    ::close(fd);
    return h;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

std::string duration(double s) {
  if (s < 0 || s > 1e7) return "?";
  const auto t = static_cast<int64_t>(s);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, t / 60 % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

bool is_disk_full(int err) {
  return err == ENOSPC || err == EDQUOT || err == EFBIG;
}

// One file's chunk size: the option's, raised (in 4 KiB steps) so a file has at most 2^20 chunks
// and its map stays small whatever --chunk-size and the listed size.
uint64_t chunk_for(uint64_t size, uint64_t chunk_bytes) {
  constexpr uint64_t kMaxChunks = uint64_t{1} << 20;
  if (size / chunk_bytes < kMaxChunks) return chunk_bytes;
  return (size / kMaxChunks + 1 + 4095) / 4096 * 4096;
}

std::string done_header(const HubFile& f, uint64_t chunk, const std::string& key) {
  return fmt::format("deltafin-pull 2 {} {} {}\n", f.size, chunk, key);
}

// True when `name` in folder `fd` is a regular file of this user with one link (not a link,
// device or folder; not a second name of a file elsewhere).
bool own_regular_file(int fd, const std::string& name) {
  struct stat st {};
  return ::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
         st.st_uid == ::geteuid() && st.st_nlink == 1;
}

// Opens `name` in the partial folder for reading and writing: the existing file when it is a
// regular file of ours with one link, else a new one (O_EXCL, 0600). Never follows a link.
int open_partial_file(int pfd, const std::string& name, const std::string& shown, bool* created) {
  *created = false;
  int fd = ::openat(pfd, name.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    fd = ::openat(pfd, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    *created = fd >= 0;
  }
  if (fd < 0) {
    if (errno == ELOOP)
      fail(
          "{}: is a symbolic link, not a partial file pull made: refusing to follow it (remove it)",
          shown);
    fail("{}: cannot open or create the partial file: {}", shown, std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
      st.st_nlink != 1) {
    ::close(fd);
    fail(
        "{}: is not a partial file pull made (expected a regular file of this user with one "
        "link): refusing to write to it (remove it)",
        shown);
  }
  return fd;
}

// The folder of DIR/`path`'s file, created (0700) where missing, every step opened with
// O_NOFOLLOW: a link along the way stops the publish instead of being followed.
int open_target_folder(int dir_fd, const std::string& dir, const std::string& path) {
  int fd = ::dup(dir_fd);
  if (fd < 0) fail("{}: {}", dir, std::strerror(errno));
  size_t b = 0;
  for (size_t e = path.find('/'); e != std::string::npos; b = e + 1, e = path.find('/', b)) {
    const std::string part = path.substr(b, e - b);
    if (::mkdirat(fd, part.c_str(), 0700) != 0 && errno != EEXIST) {
      const int err = errno;
      ::close(fd);
      fail("{}: cannot create the folder: {}", (fs::path(dir) / path.substr(0, e)).string(),
           std::strerror(err));
    }
    const int next = ::openat(fd, part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    const int err = errno;
    ::close(fd);
    if (next < 0)
      fail("{}: cannot open it as a folder ({}): refusing to write through a link or a file",
           (fs::path(dir) / path.substr(0, e)).string(), std::strerror(err));
    fd = next;
  }
  return fd;
}

// The chunks of `f` an earlier run finished, from its map KEY.done (one '1' per finished chunk
// after done_header), when both partial files are regular files of ours and the map's header
// matches this file and chunk size; all unfinished otherwise. Opens nothing for writing and keeps
// nothing open.
std::vector<uint8_t> read_done_map(int pfd, const HubFile& f, uint64_t chunk,
                                   const std::string& key, const std::string& part_name,
                                   const std::string& done_name) {
  const size_t chunks = std::max<size_t>(1, static_cast<size_t>((f.size + chunk - 1) / chunk));
  std::vector<uint8_t> done(chunks, 0);
  if (!own_regular_file(pfd, part_name) || !own_regular_file(pfd, done_name)) return done;
  const int fd = ::openat(pfd, done_name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return done;
  const std::string header = done_header(f, chunk, key);
  std::string have(header.size() + chunks, '\0');
  const ssize_t n = ::pread(fd, have.data(), have.size(), 0);
  ::close(fd);
  if (n != static_cast<ssize_t>(have.size()) || have.compare(0, header.size(), header) != 0)
    return done;
  for (size_t k = 0; k < chunks; ++k) done[k] = have[header.size() + k] == '1';
  return done;
}

struct FileState {
  HubFile f;
  std::string key, target, part_name, done_name;
  uint64_t chunk = 0;
  int fd = -1, done_fd = -1;  // open while chunks of the file are in flight
  size_t chunks = 0;
  std::vector<uint8_t> done;
  size_t remaining = 0;
  bool allocated = false;
  int attempts = 0;
  std::mutex mu;
};

class Fetcher {
 public:
  Fetcher(const HubRepo& repo, PullState& state, const std::string& token, const FetchOptions& o)
      : repo_(repo),
        state_(state),
        dir_(state.dir()),
        token_(token),
        o_(o),
        tty_(::isatty(STDERR_FILENO) != 0) {}

  FetchResult run(const std::vector<HubFile>& files) {
    pfd_ = state_.partial_fd(true);
    for (const auto& f : files) {
      auto s = std::make_unique<FileState>();
      s->f = f;
      s->key = partial_key(f);
      s->target = (fs::path(dir_) / f.path).string();
      s->part_name = s->key + ".part";
      s->done_name = s->key + ".done";
      s->chunk = chunk_for(f.size, o_.chunk_bytes);
      s->chunks = std::max<size_t>(1, static_cast<size_t>((f.size + s->chunk - 1) / s->chunk));
      load_map(*s);
      total_ += f.size;
      for (size_t k = 0; k < s->chunks; ++k) {
        if (s->done[k]) {
          have_ += chunk_len(*s, k);
        } else {
          queue_.push_back({files_.size(), k});
        }
      }
      files_.push_back(std::move(s));
    }
    // A file whose chunks were all done before this run (stopped while hashing) is finished here.
    for (size_t i = 0; i < files_.size() && !stop_; ++i) {
      if (files_[i]->remaining != 0) continue;
      bool opened = false;
      {
        std::lock_guard<std::mutex> l(files_[i]->mu);
        opened = open_files(*files_[i]);
      }
      if (opened) finish(i);
    }
    std::vector<std::thread> workers;
    const int n = std::max(1, std::min<int>(o_.connections, static_cast<int>(queue_.size())));
    for (int w = 0; w < n && !stop_; ++w) workers.emplace_back([this] { work(); });
    std::thread progress([this] { report(); });
    for (auto& t : workers) t.join();
    {
      std::lock_guard<std::mutex> l(mu_);
      finished_ = true;
    }
    cv_.notify_all();
    progress.join();
    for (auto& s : files_) close_files(*s);
    FetchResult r;
    r.bytes_fetched = fetched_;
    r.files_published = published_;
    r.refetched = refetched_;
    r.seconds = clock_.elapsed();
    if (!error_.empty()) fail("{}", error_);
    return r;
  }

 private:
  struct Task {
    size_t file, chunk;
  };

  uint64_t chunk_len(const FileState& s, size_t k) const {
    const uint64_t b = k * s.chunk;
    return std::min(s.chunk, s.f.size - std::min(s.f.size, b));
  }

  std::string shown(const std::string& name) const {
    return (fs::path(state_.partial_path()) / name).string();
  }

  // The chunks an earlier run finished (read_done_map).
  void load_map(FileState& s) {
    s.done = read_done_map(pfd_, s.f, s.chunk, s.key, s.part_name, s.done_name);
    s.remaining = static_cast<size_t>(std::count(s.done.begin(), s.done.end(), 0));
  }

  // Opens the file's map (first, so every partial file has one) and partial file, writing the
  // map as this run knows it. Called with s.mu held; false after a fatal error.
  bool open_files(FileState& s) {
    if (s.fd >= 0) return true;
    const auto failed = [&](const std::string& message) {
      close_files(s);
      fatal(message);
      return false;
    };
    try {
      bool created = false;
      s.done_fd = open_partial_file(pfd_, s.done_name, shown(s.done_name), &created);
      std::string map = done_header(s.f, s.chunk, s.key);
      for (uint8_t d : s.done) map += d ? '1' : '\0';
      if (::pwrite(s.done_fd, map.data(), map.size(), 0) != static_cast<ssize_t>(map.size()) ||
          ::ftruncate(s.done_fd, static_cast<off_t>(map.size())) != 0) {
        return failed(disk_message(errno, shown(s.done_name)));
      }
      s.fd = open_partial_file(pfd_, s.part_name, shown(s.part_name), &created);
      if (created && s.remaining != s.chunks) {
        return failed(fmt::format("{}: the partial file vanished while pull ran: run it again",
                                  shown(s.part_name)));
      }
      // Never longer than the file (the hash covers every byte of it).
      struct stat st {};
      if (::fstat(s.fd, &st) != 0 || (static_cast<uint64_t>(st.st_size) > s.f.size &&
                                      ::ftruncate(s.fd, static_cast<off_t>(s.f.size)) != 0)) {
        return failed(disk_message(errno, shown(s.part_name)));
      }
    } catch (const std::exception& e) {
      return failed(e.what());
    }
    return true;
  }

  static void close_files(FileState& s) {
    if (s.fd >= 0) ::close(s.fd);
    if (s.done_fd >= 0) ::close(s.done_fd);
    s.fd = s.done_fd = -1;
  }

  void fatal(const std::string& message) {
    std::lock_guard<std::mutex> l(mu_);
    if (error_.empty()) error_ = message;
    stop_ = true;
    cv_.notify_all();
  }

  std::string disk_message(int err, const std::string& path) {
    if (!is_disk_full(err)) return fmt::format("{}: write failed: {}", path, std::strerror(err));
    const uint64_t free = free_bytes(dir_).value_or(0);
    return fmt::format(
        "disk full writing {} ({}): {} of {} fetched, {} still to fetch, {} free in {}; free "
        "space and run the same command again: it resumes where it stopped",
        path, std::strerror(err), disk_bytes(static_cast<double>(have_.load())),
        disk_bytes(static_cast<double>(total_)),
        disk_bytes(static_cast<double>(total_ - have_.load())),
        disk_bytes(static_cast<double>(free)), dir_);
  }

  bool take(Task& t) {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_ || queue_.empty()) return false;
    t = queue_.front();
    queue_.pop_front();
    return true;
  }

  void work() {
    HttpClient http(token_, repo_.endpoint);
    Task t{};
    while (take(t)) {
      FileState& s = *files_[t.file];
      {
        std::lock_guard<std::mutex> l(s.mu);
        if (!open_files(s)) return;
        if (!s.allocated && s.f.size > 0) {
          // Reserve the file's space now, so a full disk stops the run here, between chunks.
          const int err = ::posix_fallocate(s.fd, 0, static_cast<off_t>(s.f.size));
          if (err != 0 && err != EOPNOTSUPP && err != EINVAL) {
            fatal(disk_message(err, s.target));
            return;
          }
          s.allocated = true;
        }
      }
      if (!fetch_chunk(http, s, t.chunk)) return;
      bool complete = false;
      {
        std::lock_guard<std::mutex> l(s.mu);
        const char one = '1';
        const off_t at = static_cast<off_t>(done_header(s.f, s.chunk, s.key).size() + t.chunk);
        // The chunk's bytes reach the disk before the map says so.
        if (::fdatasync(s.fd) != 0 || ::pwrite(s.done_fd, &one, 1, at) != 1) {
          fatal(disk_message(errno, shown(s.part_name)));
          return;
        }
        s.done[t.chunk] = 1;
        complete = --s.remaining == 0;
      }
      if (complete) finish(t.file);
    }
  }

  // Fetches one chunk with retries; false on a fatal error or a stop.
  bool fetch_chunk(HttpClient& http, FileState& s, size_t k) {
    const uint64_t begin = k * s.chunk, len = chunk_len(s, k);
    const std::string url = resolve_url(repo_, s.f.path);
    uint64_t got = 0;
    int failures = 0;
    while (got < len) {
      if (stop_) return false;
      const uint64_t from = begin + got;
      int write_error = 0;
      bool bad_range = false;
      HttpResult res;
      auto sink = [&](const char* data, size_t n) {
        const uint64_t keep = std::min<uint64_t>(n, len - got);
        if (keep < n) {
          bad_range = true;
          return false;
        }
        size_t off = 0;
        while (off < keep) {
          const ssize_t w =
              ::pwrite(s.fd, data + off, keep - off, static_cast<off_t>(begin + got + off));
          if (w < 0 && errno == EINTR) continue;
          if (w <= 0) {
            write_error = w < 0 ? errno : EIO;
            return false;
          }
          off += static_cast<size_t>(w);
        }
        got += keep;
        have_ += keep;
        fetched_ += keep;
        return true;
      };
      const uint64_t before = got;
      res = http.get_range(url, from, begin + len, sink, [this] { return stop_.load(); });
      if (write_error != 0) {
        fatal(disk_message(write_error, s.target));
        return false;
      }
      if (stop_) return false;
      if (res.status == 206 && !res.content_range.empty() &&
          res.content_range.rfind(fmt::format("bytes {}-", from), 0) != 0) {
        bad_range = true;
      }
      if (res.status == 200 && !(from == 0 && len == s.f.size)) bad_range = true;
      if (bad_range) {
        fatal(
            fmt::format("{}: the server answered a range request for bytes {}-{} with {} "
                        "(Content-Range \"{}\"): it does not serve ranges as asked",
                        s.f.path, from, begin + len - 1, res.status, res.content_range));
        return false;
      }
      if ((res.status == 200 || res.status == 206) && got == len) return true;
      const bool transient = res.status == 0 || res.status == 200 || res.status == 206 ||
                             res.status == 408 || res.status == 429 || res.status >= 500;
      if (!transient) {
        fatal(http_failure(res, s.f.path, !token_.empty()));
        return false;
      }
      failures = got > before ? 1 : failures + 1;  // progress resets the count
      if (failures >= o_.max_tries) {
        fatal(fmt::format("{}: giving up after {} tries without progress: {}", s.f.path, failures,
                          http_failure(res, "last try", !token_.empty())));
        return false;
      }
      double wait = std::min(30.0, 0.25 * static_cast<double>(1 << std::min(failures, 7)));
      if (!res.retry_after.empty()) {
        try {
          wait = std::min(60.0, std::stod(res.retry_after));
        } catch (...) {
        }
      }
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, std::chrono::duration<double>(wait), [this] { return stop_.load(); });
    }
    return true;
  }

  // All chunks of a file are on disk: check its hash, then publish it or fetch it again.
  void finish(size_t i) {
    FileState& s = *files_[i];
    const std::string want = !s.f.sha256.empty() ? s.f.sha256 : s.f.oid;
    std::string got;
    try {
      got = digest_fd(s.fd, s.f.sha256.empty(), shown(s.part_name));
    } catch (const std::exception& e) {
      fatal(e.what());
      return;
    }
    if (got != want) {
      std::lock_guard<std::mutex> l(s.mu);
      if (++s.attempts >= 3) {
        fatal(
            fmt::format("{}: its hash is {} but the hub lists {}, on {} downloads: the hub "
                        "serves other bytes than its listing says",
                        s.f.path, got, want, s.attempts));
        return;
      }
      log_line(fmt::format("{}: hash mismatch (got {}, the hub lists {}): fetching it again",
                           s.f.path, got.substr(0, 16), want.substr(0, 16)));
      const std::string header = done_header(s.f, s.chunk, s.key);
      std::string zeros(s.chunks, '\0');
      if (::pwrite(s.done_fd, zeros.data(), zeros.size(), static_cast<off_t>(header.size())) < 0) {
        fatal(disk_message(errno, shown(s.done_name)));
        return;
      }
      std::fill(s.done.begin(), s.done.end(), 0);
      s.remaining = s.chunks;
      have_ -= s.f.size;
      ++refetched_;
      close_files(s);  // reopened when its first chunk is taken again
      std::lock_guard<std::mutex> q(mu_);
      for (size_t k = 0; k < s.chunks; ++k) queue_.push_back({i, k});
      return;
    }
    // Into place: the target's folders are created (0700) and opened without following a link;
    // the rename replaces at most a regular file (check_target refused anything else).
    int folder = -1;
    try {
      folder = open_target_folder(state_.dir_fd(), dir_, s.f.path);
    } catch (const std::exception& e) {
      fatal(e.what());
      return;
    }
    const std::string name = fs::path(s.f.path).filename().string();
    if (::fsync(s.fd) != 0 || ::renameat(pfd_, s.part_name.c_str(), folder, name.c_str()) != 0) {
      const int err = errno;
      ::close(folder);
      fatal(fmt::format("{}: cannot move the finished file into place: {}", s.target,
                        std::strerror(err)));
      return;
    }
    ::fsync(folder);
    ::close(folder);
    ::unlinkat(pfd_, s.done_name.c_str(), 0);
    {
      std::lock_guard<std::mutex> l(s.mu);
      close_files(s);
    }
    ++published_;
    log_line(fmt::format("{} ({}) verified{}", s.f.path, disk_bytes(static_cast<double>(s.f.size)),
                         s.f.sha256.empty() ? " (git blob id)" : " (sha256)"));
  }

  void log_line(const std::string& line) {
    std::lock_guard<std::mutex> l(print_mu_);
    fmt::print(stderr, "{}{}\n", tty_ ? "\r\033[K" : "", line);
  }

  // A bar with rate and ETA on a terminal (twice a second); a plain line every 30 s otherwise.
  void report() {
    double last_line = 0;
    std::unique_lock<std::mutex> l(mu_);
    while (!finished_) {
      cv_.wait_for(l, std::chrono::milliseconds(500));
      if (finished_) break;
      const double t = clock_.elapsed();
      const double done = static_cast<double>(have_.load()), total = static_cast<double>(total_);
      const double rate = t > 0 ? static_cast<double>(fetched_.load()) / t : 0;
      const double eta = rate > 0 ? (total - done) / rate : -1;
      const double pct = total > 0 ? 100 * done / total : 100;
      std::lock_guard<std::mutex> p(print_mu_);
      if (tty_) {
        const int width = 30, fill = static_cast<int>(pct * width / 100);
        fmt::print(stderr, "\r\033[K[{}{}] {:5.1f}% {} of {}  {}/s  ETA {}",
                   std::string(static_cast<size_t>(fill), '#'),
                   std::string(static_cast<size_t>(width - fill), '.'), pct, disk_bytes(done),
                   disk_bytes(total), disk_bytes(rate), duration(eta));
      } else if (t - last_line >= 30) {
        last_line = t;
        fmt::print(stderr, "pull: {:.1f}% ({} of {}), {}/s, ETA {}\n", pct, disk_bytes(done),
                   disk_bytes(total), disk_bytes(rate), duration(eta));
      }
    }
    if (tty_) fmt::print(stderr, "\r\033[K");
  }

  const HubRepo& repo_;
  PullState& state_;
  std::string dir_, token_;
  FetchOptions o_;
  int pfd_ = -1;  // the partial folder (state_'s)
  bool tty_;
  std::vector<std::unique_ptr<FileState>> files_;
  std::deque<Task> queue_;
  std::mutex mu_, print_mu_;
  std::condition_variable cv_;
  std::atomic<bool> stop_{false};
  bool finished_ = false;
  std::string error_;
  uint64_t total_ = 0;
  std::atomic<uint64_t> have_{0}, fetched_{0};
  std::atomic<int> published_{0}, refetched_{0};
  Stopwatch clock_;
};

}  // namespace

std::string partial_key(const HubFile& f) {
  // check_repo_path keeps newlines out of paths, and the ids are hex: the text is unambiguous.
  const std::string text =
      fmt::format("deltafin-pull partial\n{}\n{}\n{}\n{}\n", f.path, f.oid, f.sha256, f.size);
  FileHasher h(false, 0);
  h.update(text.data(), text.size());
  return h.hex();
}

namespace {

// Opens (creating, 0700, when `create`) the folder `name` in `parent`, refusing a link or
// anything but a folder; -1 when absent and not created.
int open_state_folder(int parent, const std::string& name, const std::string& shown, bool create) {
  struct stat st {};
  if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) fail("{}: {}", shown, std::strerror(errno));
    if (!create) return -1;
    if (::mkdirat(parent, name.c_str(), 0700) != 0 && errno != EEXIST)
      fail("{}: cannot create it: {}", shown, std::strerror(errno));
  } else if (S_ISLNK(st.st_mode)) {
    fail(
        "{} is a symbolic link: pull keeps its own state there and does not follow a link out "
        "of --dir (remove it)",
        shown);
  } else if (!S_ISDIR(st.st_mode)) {
    fail("{} exists and is not a folder: pull keeps its own state there (remove it)", shown);
  }
  const int fd = ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    fail("{}: cannot open it as a folder ({}): refusing to follow a link", shown,
         std::strerror(errno));
  return fd;
}

// True for KEY.done names pull makes: KEY 64 hex digits (or 40/64 from the previous format,
// which named partial files by the listed hash).
bool done_name_stem(const std::string& name, std::string* stem) {
  if (!name.ends_with(".done")) return false;
  *stem = name.substr(0, name.size() - 5);
  if (stem->size() != 64 && stem->size() != 40) return false;
  return std::all_of(stem->begin(), stem->end(),
                     [](char ch) { return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'); });
}

}  // namespace

PullState::PullState(const std::string& dir) : dir_(dir) {
  dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd_ < 0) fail("--dir {}: cannot open it as a folder: {}", dir, std::strerror(errno));
  try {
    state_fd_ = open_state_folder(dir_fd_, ".deltafin-pull",
                                  (fs::path(dir) / ".deltafin-pull").string(), true);
  } catch (...) {
    ::close(dir_fd_);
    throw;
  }
}

PullState::~PullState() {
  for (int fd : {partial_fd_, state_fd_, dir_fd_})
    if (fd >= 0) ::close(fd);
}

std::string PullState::partial_path() const {
  return (fs::path(dir_) / ".deltafin-pull" / "partial").string();
}

int PullState::partial_fd(bool create) {
  if (partial_fd_ < 0)
    partial_fd_ = open_state_folder(state_fd_, "partial", partial_path(), create);
  return partial_fd_;
}

std::string PullState::read_manifest() const {
  const int fd =
      ::openat(state_fd_, "manifest.json", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= (off_t{1} << 30)) {
    text.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = ::pread(fd, text.data() + got, text.size() - got, static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    text.resize(got);
  }
  ::close(fd);
  return text;
}

void PullState::write_manifest(const std::string& text) const {
  const std::string shown = (fs::path(dir_) / ".deltafin-pull" / "manifest.json").string();
  const std::string tmp = fmt::format("manifest.json.tmp.{}", ::getpid());
  ::unlinkat(state_fd_, tmp.c_str(), 0);  // a leftover of a run that had our process id
  const int fd =
      ::openat(state_fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) fail("{}: cannot write it: {}", shown, std::strerror(errno));
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  const int err = off < text.size() ? (errno != 0 ? errno : EIO) : 0;
  if (err != 0 || ::fsync(fd) != 0 ||
      ::renameat(state_fd_, tmp.c_str(), state_fd_, "manifest.json") != 0) {
    const int e = err != 0 ? err : errno;
    ::close(fd);
    ::unlinkat(state_fd_, tmp.c_str(), 0);
    fail("{}: cannot write it: {}", shown, std::strerror(e));
  }
  ::close(fd);
  ::fsync(state_fd_);
}

uint64_t PullState::partial_bytes(const std::vector<HubFile>& files) {
  const int pfd = partial_fd(false);
  if (pfd < 0) return 0;
  uint64_t n = 0;
  for (const auto& f : files) {
    struct stat st {};
    const std::string name = partial_key(f) + ".part";
    if (::fstatat(pfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
      n += std::min<uint64_t>(f.size, static_cast<uint64_t>(st.st_blocks) * 512);
  }
  return n;
}

uint64_t PullState::fetched_bytes(const std::vector<HubFile>& files, uint64_t chunk_bytes) {
  const int pfd = partial_fd(false);
  if (pfd < 0) return 0;
  uint64_t n = 0;
  for (const auto& f : files) {
    const std::string key = partial_key(f);
    const uint64_t chunk = chunk_for(f.size, chunk_bytes);
    const auto done = read_done_map(pfd, f, chunk, key, key + ".part", key + ".done");
    for (size_t k = 0; k < done.size(); ++k)
      if (done[k]) n += std::min(chunk, f.size - std::min(f.size, k * chunk));
  }
  return n;
}

int PullState::remove_stale_partials(const std::vector<HubFile>& keep) {
  const int pfd = partial_fd(false);
  if (pfd < 0) return 0;
  std::set<std::string> kept;
  for (const auto& f : keep) kept.insert(partial_key(f));
  std::vector<std::string> stems;
  const int list_fd = ::openat(pfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (DIR* d = list_fd >= 0 ? ::fdopendir(list_fd) : nullptr) {
    while (const dirent* e = ::readdir(d)) {
      std::string stem;
      if (done_name_stem(e->d_name, &stem) && kept.count(stem) == 0) stems.push_back(stem);
    }
    ::closedir(d);
  } else if (list_fd >= 0) {
    ::close(list_fd);
  }
  int removed = 0;
  for (const auto& stem : stems) {
    // Ours: a regular file of this user whose first bytes are the map's header.
    const std::string done = stem + ".done", part = stem + ".part";
    if (!own_regular_file(pfd, done)) continue;
    const int fd = ::openat(pfd, done.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    char head[16] = {};
    const ssize_t n = ::pread(fd, head, sizeof head, 0);
    ::close(fd);
    const std::string_view h(head, n > 0 ? static_cast<size_t>(n) : 0);
    if (h != "deltafin-pull 1 " && h != "deltafin-pull 2 ") continue;
    if (own_regular_file(pfd, part) && ::unlinkat(pfd, part.c_str(), 0) == 0) ++removed;
    if (::unlinkat(pfd, done.c_str(), 0) == 0) ++removed;
  }
  if (::unlinkat(state_fd_, "partial", AT_REMOVEDIR) == 0) {  // only when empty
    ::close(partial_fd_);
    partial_fd_ = -1;
  }
  return removed;
}

FetchResult fetch_files(const HubRepo& repo, const std::vector<HubFile>& files, PullState& state,
                        const std::string& token, const FetchOptions& o) {
  Fetcher f(repo, state, token, o);
  return f.run(files);
}

FileHasher::FileHasher(bool git_blob, uint64_t size) : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr) throw std::bad_alloc();
  auto* c = static_cast<EVP_MD_CTX*>(ctx_);
  EVP_DigestInit_ex(c, git_blob ? EVP_sha1() : EVP_sha256(), nullptr);
  if (git_blob) {
    const std::string header = fmt::format("blob {}", size) + std::string(1, '\0');
    EVP_DigestUpdate(c, header.data(), header.size());
  }
}

FileHasher::~FileHasher() {
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
}

void FileHasher::update(const void* data, size_t n) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n);
}

std::string FileHasher::hex() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out, &len);
  return hex_of(out, len);
}

std::string file_sha256(const std::string& path) {
  return digest_file(path, false);
}

std::string file_git_oid(const std::string& path) {
  return digest_file(path, true);
}

}  // namespace deltafin::pull
