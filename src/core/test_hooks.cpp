#include "core/test_hooks.h"

#include <algorithm>
#include <cstdlib>

#include "core/log.h"

namespace deltafin {

const char* test_hook_env(const char* name) {
  const char* v = ::secure_getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

int debug_step_delay_ms() {
  const char* v = test_hook_env("DELTAFIN_DEBUG_STEP_DELAY_MS");
  if (v == nullptr) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || n < 0) {
    log_warn("DELTAFIN_DEBUG_STEP_DELAY_MS: cannot use \"{}\" (expected a number of ms): no delay",
             v);
    return 0;
  }
  const int ms = static_cast<int>(std::min<long>(n, 60000));
  log_warn("DELTAFIN_DEBUG_STEP_DELAY_MS: every engine step is slowed by {} ms", ms);
  return ms;
}

}  // namespace deltafin
