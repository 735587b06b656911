// What the machine has: memory (physical, cgroup limit), peak RSS, CPU features, and a quick
// memory-bandwidth probe used by `deltafin bench` to state the roofline.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
// Starts the peak RSS over from the current RSS (Linux: /proc/self/clear_refs); false where it
// cannot.
bool reset_peak_rss();
uint64_t current_rss_bytes();
// Bytes this process has caused to be fetched from storage (Linux /proc/self/io read_bytes:
// page-cache misses and direct reads alike); 0 where unknown.
uint64_t process_storage_read_bytes();

// Streams `bytes` of memory a few times with `threads` threads and returns bytes/s (read).
double measure_memory_bandwidth(int threads, uint64_t bytes = 256ull << 20);

std::string cpu_model_name();

}  // namespace deltafin

namespace deltafin {
// Sequential read bandwidth of `files` with O_DIRECT (page cache bypassed): `threads` readers
// each reading `chunk`-byte blocks into huge-page buffers as the engine's readers do (the
// default chunk is the trunk streamer's read task), up to `max_bytes` in all. Returns bytes/s
// (0 if nothing could be read).
double measure_disk_bandwidth(const std::vector<std::string>& files, int threads,
                              uint64_t max_bytes = 2ull << 30, uint64_t chunk = 8ull << 20);
}  // namespace deltafin
