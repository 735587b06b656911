#include "core/sysinfo.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "core/weight_buffer.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace deltafin {

std::string CpuFeatures::describe() const {
  std::string s;
  auto add = [&](bool b, const char* n) {
    if (b) {
      if (!s.empty()) s += ' ';
      s += n;
    }
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(neon, "neon");
  return s.empty() ? "scalar" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
#if defined(__x86_64__)
    __builtin_cpu_init();
    c.avx2 = __builtin_cpu_supports("avx2");
    c.fma = __builtin_cpu_supports("fma");
    c.avx512f = __builtin_cpu_supports("avx512f");
    c.avx512bw = __builtin_cpu_supports("avx512bw");
    c.avx512vl = __builtin_cpu_supports("avx512vl");
    c.avx512dq = __builtin_cpu_supports("avx512dq");
    unsigned a, b, cc, d;
    if (__get_cpuid(1, &a, &b, &cc, &d)) c.f16c = (cc & bit_F16C) != 0;
#elif defined(__aarch64__)
    c.neon = true;
#endif
    return c;
  }();
  return f;
}

uint64_t physical_memory_bytes() {
  long pages = ::sysconf(_SC_PHYS_PAGES);
  long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

namespace {
uint64_t read_u64_file(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return 0;
  try {
    return std::stoull(s);
  } catch (...) {
    return 0;
  }
}
}  // namespace

uint64_t cgroup_memory_limit_bytes() {
#if defined(__linux__)
  // Find this process's cgroup paths.
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  uint64_t best = 0;
  auto consider = [&](uint64_t v) {
    // cgroup v1 reports "unlimited" as a huge page-rounded number.
    if (v == 0 || v >= (1ull << 60)) return;
    if (best == 0 || v < best) best = v;
  };
  while (std::getline(in, line)) {
    // hierarchy-ID:controller-list:cgroup-path
    auto c1 = line.find(':');
    auto c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string path = line.substr(c2 + 1);
    if (controllers.empty()) {  // v2
      consider(read_u64_file("/sys/fs/cgroup" + path + "/memory.max"));
    } else if (controllers.find("memory") != std::string::npos) {
      // v1: walk up the hierarchy; any ancestor limit applies.
      std::string p = path;
      while (true) {
        consider(read_u64_file("/sys/fs/cgroup/memory" + p + "/memory.limit_in_bytes"));
        if (p.empty() || p == "/") break;
        auto slash = p.rfind('/');
        p = slash == 0 ? "/" : p.substr(0, slash);
      }
    }
  }
  return best;
#else
  return 0;
#endif
}

uint64_t peak_rss_bytes() {
#if defined(__linux__)
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream ss(line.substr(6));
      uint64_t kb = 0;
      ss >> kb;
      return kb * 1024;
    }
  }
#endif
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
#if defined(__APPLE__)
  return static_cast<uint64_t>(ru.ru_maxrss);
#else
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
#endif
}

bool reset_peak_rss() {
#if defined(__linux__)
  std::ofstream out("/proc/self/clear_refs");
  out << "5";  // 5: reset the peak RSS to the current RSS (Linux 4.0)
  out.flush();
  return static_cast<bool>(out);
#else
  return false;
#endif
}

uint64_t current_rss_bytes() {
#if defined(__linux__)
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
#else
  return peak_rss_bytes();
#endif
}

uint64_t process_storage_read_bytes() {
#if defined(__linux__)
  std::ifstream in("/proc/self/io");
  std::string key;
  uint64_t v = 0;
  while (in >> key >> v) {
    if (key == "read_bytes:") return v;
  }
#endif
  return 0;
}

double measure_memory_bandwidth(int threads, uint64_t bytes) {
  threads = std::max(1, threads);
  size_t n = bytes / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = i;
  ThreadPool pool(threads);
  std::vector<uint64_t> sums(threads, 0);
  auto pass = [&] {
    pool.run(threads, [&](int t, int) {
      size_t b = n * t / threads, e = n * (t + 1) / threads;
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      size_t i = b;
      for (; i + 4 <= e; i += 4) {
        s0 += buf[i];
        s1 += buf[i + 1];
        s2 += buf[i + 2];
        s3 += buf[i + 3];
      }
      for (; i < e; ++i) s0 += buf[i];
      sums[t] += s0 + s1 + s2 + s3;
    });
  };
  pass();  // warm
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    Stopwatch sw;
    pass();
    double t = sw.elapsed();
    if (t > 0) best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / t);
  }
  volatile uint64_t sink = 0;
  for (auto s : sums) sink = sink + s;
  (void)sink;
  return best;
}

std::string cpu_model_name() {
#if defined(__linux__)
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  }
#endif
  return "unknown CPU";
}

}  // namespace deltafin

#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>

namespace deltafin {

double measure_disk_bandwidth(const std::vector<std::string>& files, int threads,
                              uint64_t max_bytes, uint64_t chunk) {
  struct Part {
    int fd;
    uint64_t offset;
  };
  std::vector<int> fds;
  std::vector<Part> parts;
  uint64_t planned = 0;
  // Small models: smaller blocks, so the probe still has something to read.
  uint64_t total = 0;
  for (const auto& f : files) {
    struct stat st {};
    if (::stat(f.c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_size);
  }
  const uint64_t want = std::max<uint64_t>(1, static_cast<uint64_t>(std::max(1, threads)) * 8);
  chunk = std::clamp<uint64_t>(std::min(total, max_bytes) / want / 4096 * 4096, 64 << 10, chunk);
  for (const auto& f : files) {
    int fd = -1;
    try {
      fd = open_for_reading(f, true);
    } catch (const IoError&) {
      continue;  // the probe measures what it can read
    }
    fds.push_back(fd);
    off_t size = ::lseek(fd, 0, SEEK_END);
    for (uint64_t off = 0; off + chunk <= static_cast<uint64_t>(size) && planned < max_bytes;
         off += chunk) {
      parts.push_back({fd, off});
      planned += chunk;
    }
    if (planned >= max_bytes) break;
  }
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  Stopwatch sw;
  std::vector<std::thread> ts;
  for (int t = 0; t < std::max(1, threads); ++t) {
    ts.emplace_back([&] {
      // The engine's own kind of read buffer (huge-page advised): an O_DIRECT read into 4 KiB
      // pages pins every page and reaches the device in smaller requests, about half as fast
      // (docs/DOCTOR.md, "The forecast", gives the figures).
      uint8_t* buf = nullptr;
      try {
        buf = alloc_weight_buffer(chunk, "the disk probe");
      } catch (const Error&) {
        return;
      }
      for (size_t i = next++; i < parts.size(); i = next++) {
        ssize_t n = ::pread(parts[i].fd, buf, chunk, static_cast<off_t>(parts[i].offset));
        if (n > 0) done += static_cast<uint64_t>(n);
      }
      std::free(buf);
    });
  }
  for (auto& t : ts) t.join();
  const double el = sw.elapsed();
  for (int fd : fds) ::close(fd);
  return el > 0 ? static_cast<double>(done.load()) / el : 0.0;
}

}  // namespace deltafin
