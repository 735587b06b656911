#include "cli/fetch.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
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
#include <thread>

#include "cli/common.h"
#include "core/error.h"
#include "core/timer.h"

namespace deltafin::cli {

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

std::string digest_file(const std::string& path, bool git_blob) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot read it to check its hash: {}", path, std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  FileHasher h(git_blob, static_cast<uint64_t>(st.st_size));
  std::vector<unsigned char> buf(4u << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fail("{}: read failed while checking its hash: {}", path, std::strerror(err));
    }
    if (n == 0) break;
    h.update(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return h.hex();
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

std::string key_of(const HubFile& f) {
  if (!f.sha256.empty()) return f.sha256;
  if (!f.oid.empty()) return f.oid;
  std::string k;  // no hash listed: a name from the path
  for (char ch : f.path) k += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return k;
}

std::string done_header(const HubFile& f, uint64_t chunk) {
  return fmt::format("deltafin-pull 1 {} {} {}\n", f.size, chunk, key_of(f));
}

struct FileState {
  HubFile f;
  std::string target, part, done_path;
  int fd = -1, done_fd = -1;
  size_t chunks = 0;
  std::vector<uint8_t> done;
  size_t remaining = 0;
  bool allocated = false;
  int attempts = 0;
  std::mutex mu;
};

// Opens (or creates) the partial file and its map; a map that does not match is reset.
void open_partial(FileState& s, uint64_t chunk) {
  s.chunks = std::max<size_t>(1, static_cast<size_t>((s.f.size + chunk - 1) / chunk));
  s.fd = ::open(s.part.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (s.fd < 0) fail("{}: cannot create the partial file: {}", s.part, std::strerror(errno));
  s.done_fd = ::open(s.done_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (s.done_fd < 0) fail("{}: cannot create it: {}", s.done_path, std::strerror(errno));
  const std::string header = done_header(s.f, chunk);
  std::string have(header.size() + s.chunks, '\0');
  const ssize_t n = ::pread(s.done_fd, have.data(), have.size(), 0);
  s.done.assign(s.chunks, 0);
  if (n == static_cast<ssize_t>(have.size()) && have.compare(0, header.size(), header) == 0) {
    for (size_t k = 0; k < s.chunks; ++k) s.done[k] = have[header.size() + k] == '1';
  } else if (::ftruncate(s.done_fd, 0) != 0 || ::pwrite(s.done_fd, header.data(), header.size(),
                                                        0) != static_cast<ssize_t>(header.size())) {
    fail("{}: cannot write it: {}", s.done_path, std::strerror(errno));
  }
  s.remaining = static_cast<size_t>(std::count(s.done.begin(), s.done.end(), 0));
}

class Fetcher {
 public:
  Fetcher(const HubRepo& repo, const std::string& dir, const std::string& token,
          const FetchOptions& o)
      : repo_(repo), dir_(dir), token_(token), o_(o), tty_(::isatty(STDERR_FILENO) != 0) {}

  FetchResult run(const std::vector<HubFile>& files) {
    const std::string pdir = partial_dir(dir_);
    for (const auto& f : files) {
      auto s = std::make_unique<FileState>();
      s->f = f;
      s->target = (fs::path(dir_) / f.path).string();
      s->part = (fs::path(pdir) / (key_of(f) + ".part")).string();
      s->done_path = (fs::path(pdir) / (key_of(f) + ".done")).string();
      open_partial(*s, o_.chunk_bytes);
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
    for (size_t i = 0; i < files_.size(); ++i)
      if (files_[i]->remaining == 0) finish(i);
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
    for (auto& s : files_) {
      if (s->fd >= 0) ::close(s->fd);
      if (s->done_fd >= 0) ::close(s->done_fd);
    }
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
    const uint64_t b = k * o_.chunk_bytes;
    return std::min(o_.chunk_bytes, s.f.size - std::min(s.f.size, b));
  }

  void fatal(const std::string& message) {
    std::lock_guard<std::mutex> l(mu_);
    if (error_.empty()) error_ = message;
    stop_ = true;
    cv_.notify_all();
  }

  std::string disk_message(int err, const std::string& path) {
    if (!is_disk_full(err)) return fmt::format("{}: write failed: {}", path, std::strerror(err));
    struct statvfs v {};
    const uint64_t free = ::statvfs(dir_.c_str(), &v) == 0 ? v.f_bavail * v.f_frsize : 0;
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
    HttpClient http(token_);
    Task t{};
    while (take(t)) {
      FileState& s = *files_[t.file];
      {
        std::lock_guard<std::mutex> l(s.mu);
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
        const off_t at = static_cast<off_t>(done_header(s.f, o_.chunk_bytes).size() + t.chunk);
        // The chunk's bytes reach the disk before the map says so.
        if (::fdatasync(s.fd) != 0 || ::pwrite(s.done_fd, &one, 1, at) != 1) {
          fatal(disk_message(errno, s.part));
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
    const uint64_t begin = k * o_.chunk_bytes, len = chunk_len(s, k);
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
    std::string got, want;
    try {
      if (!s.f.sha256.empty()) {
        want = s.f.sha256;
        got = file_sha256(s.part);
      } else if (!s.f.oid.empty()) {
        want = s.f.oid;
        got = file_git_oid(s.part);
      }
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
      const std::string header = done_header(s.f, o_.chunk_bytes);
      std::string zeros(s.chunks, '\0');
      if (::pwrite(s.done_fd, zeros.data(), zeros.size(), static_cast<off_t>(header.size())) < 0) {
        fatal(disk_message(errno, s.done_path));
        return;
      }
      std::fill(s.done.begin(), s.done.end(), 0);
      s.remaining = s.chunks;
      have_ -= s.f.size;
      ++refetched_;
      std::lock_guard<std::mutex> q(mu_);
      for (size_t k = 0; k < s.chunks; ++k) queue_.push_back({i, k});
      return;
    }
    std::error_code ec;
    fs::create_directories(fs::path(s.target).parent_path(), ec);
    if (::fsync(s.fd) != 0 || ::rename(s.part.c_str(), s.target.c_str()) != 0) {
      fatal(fmt::format("{}: cannot move the finished file into place: {}", s.target,
                        std::strerror(errno)));
      return;
    }
    const int dfd =
        ::open(fs::path(s.target).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
    ::unlink(s.done_path.c_str());
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
  std::string dir_, token_;
  FetchOptions o_;
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

std::string partial_dir(const std::string& dir) {
  return (fs::path(dir) / ".deltafin-pull" / "partial").string();
}

uint64_t partial_bytes(const std::string& dir, const std::vector<HubFile>& files) {
  uint64_t n = 0;
  for (const auto& f : files) {
    const std::string base = (fs::path(partial_dir(dir)) / key_of(f)).string();
    struct stat st {};
    if (::stat((base + ".part").c_str(), &st) == 0)
      n += std::min<uint64_t>(f.size, static_cast<uint64_t>(st.st_blocks) * 512);
  }
  return n;
}

FetchResult fetch_files(const HubRepo& repo, const std::vector<HubFile>& files,
                        const std::string& dir, const std::string& token, const FetchOptions& o) {
  std::error_code ec;
  fs::create_directories(partial_dir(dir), ec);
  if (ec) fail("{}: cannot create it: {}", partial_dir(dir), ec.message());
  Fetcher f(repo, dir, token, o);
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

}  // namespace deltafin::cli
