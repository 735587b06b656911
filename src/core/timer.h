// Monotonic wall-clock timing for stats and benchmarks.
#pragma once

#include <chrono>

namespace deltafin {

// True in a build under AddressSanitizer or ThreadSanitizer, which runs about ten times slower:
// clock backstops scale with it, and speed measurements (doctor's) time each product once, since
// figures measured there mean nothing and those builds check memory and threads, not speed.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
#else
inline constexpr bool kSanitizedBuild = false;
#endif

inline double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

class Stopwatch {
 public:
  Stopwatch() : start_(now_seconds()) {}
  double elapsed() const { return now_seconds() - start_; }
  void reset() { start_ = now_seconds(); }

 private:
  double start_;
};

}  // namespace deltafin
