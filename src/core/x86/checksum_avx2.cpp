// XXH3 compiled for AVX2 (this file alone gets -mavx2; core/checksum.cpp calls it only on CPUs
// that have it). The value equals the generic build's.
#include "core/checksum.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace deltafin::checksum_detail {
uint64_t xxh3_avx2(const void* data, size_t n) {
  return XXH3_64bits(data, n);
}
}  // namespace deltafin::checksum_detail
