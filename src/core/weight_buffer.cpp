#include "core/weight_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace deltafin {

uint8_t* alloc_weight_buffer(uint64_t bytes, const char* what) {
  constexpr uint64_t kPage = 4096;
  constexpr uint64_t kHuge = 2ull << 20;
  const uint64_t align = bytes >= kHuge ? kHuge : kPage;
  void* p = nullptr;
  if (::posix_memalign(&p, align, std::max(bytes, kPage)) != 0)
    fail("cannot allocate {} bytes for {}", bytes, what);
#if defined(MADV_HUGEPAGE)
  // Advice only: without THP (or on another kernel) this fails harmlessly and 4 KiB pages remain.
  if (align == kHuge) ::madvise(p, bytes / kHuge * kHuge, MADV_HUGEPAGE);
#endif
  return static_cast<uint8_t*>(p);
}

}  // namespace deltafin
