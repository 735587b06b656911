// What the machine has: memory (physical, cgroup limit), peak RSS, CPU features, and a quick
// memory-bandwidth probe used by `deltafin bench` to state the roofline.
#pragma once

#include <cstdint>
#include <string>

namespace deltafin {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool neon = false;
  std::string describe() const;
};

const CpuFeatures& cpu_features();

uint64_t physical_memory_bytes();
// The tightest cgroup (v1 or v2) memory limit that applies to this process; 0 if none.
uint64_t cgroup_memory_limit_bytes();
uint64_t peak_rss_bytes();
uint64_t current_rss_bytes();

// Streams `bytes` of memory a few times with `threads` threads and returns bytes/s (read).
double measure_memory_bandwidth(int threads, uint64_t bytes = 256ull << 20);

std::string cpu_model_name();

}  // namespace deltafin
