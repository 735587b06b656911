#include "core/checksum.h"

#include <fmt/format.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace deltafin {

namespace checksum_detail {
uint64_t xxh3_generic(const void* data, size_t n) {
  return XXH3_64bits(data, n);
}
#if !defined(DELTAFIN_CHECKSUM_AVX2)
uint64_t xxh3_avx2(const void* data, size_t n) {
  return XXH3_64bits(data, n);
}
#endif
}  // namespace checksum_detail

namespace {
using Fn = uint64_t (*)(const void*, size_t);
Fn pick() {
#if defined(DELTAFIN_CHECKSUM_AVX2)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) return checksum_detail::xxh3_avx2;
#endif
  return checksum_detail::xxh3_generic;
}
}  // namespace

uint64_t checksum64(const void* data, size_t n) {
  static const Fn fn = pick();
  return fn(data, n);
}

std::string checksum_hex(uint64_t h) {
  return fmt::format("{:016x}", h);
}

bool parse_checksum_hex(const std::string& text, uint64_t* out) {
  if (text.size() != 16) return false;
  uint64_t v = 0;
  for (char c : text) {
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (d < 0) return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

}  // namespace deltafin
