#include "core/thread_pool.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/trace.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DF_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define DF_PAUSE() asm volatile("yield")
#else
#define DF_PAUSE() \
  do {             \
  } while (0)
#endif

namespace deltafin {

namespace {
thread_local bool t_in_pool = false;
constexpr int kPureSpins = 2000;        // ~80 us of PAUSE on current x86, then yield
constexpr int kSpinIterations = 20000;  // then sleep on the condition variable
}  // namespace

int physical_cores() {
#if defined(__linux__)
  // Count distinct (physical id, core id) pairs.
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<int, int>> cores;
  std::string line;
  int phys = 0;
  while (std::getline(in, line)) {
    auto value = [&]() { return std::stoi(line.substr(line.find(':') + 1)); };
    if (line.rfind("physical id", 0) == 0) phys = value();
    if (line.rfind("core id", 0) == 0) cores.insert({phys, value()});
  }
  if (!cores.empty()) return static_cast<int>(cores.size());
#endif
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = physical_cores();
  try {
    for (int i = 1; i < threads; ++i) {
      workers_.emplace_back([this, i] { worker_loop(i); });
    }
  } catch (const std::exception& e) {
    // The system refused a thread: stop the ones started (a joinable thread destroyed would
    // terminate the process) and report it as an error the caller can handle.
    const size_t started = workers_.size() + 1;
    stop_workers();
    throw Error(fmt::format("could not start {} compute threads ({} started): {}", threads, started,
                            e.what()));
  }
}

void ThreadPool::stop_workers() {
  stop_.store(true);
  epoch_.fetch_add(1);
  {
    std::lock_guard<std::mutex> l(sleep_mutex_);
    sleep_cv_.notify_all();
  }
  for (auto& t : workers_) t.join();
  workers_.clear();
}

ThreadPool::~ThreadPool() {
  stop_workers();
}

void ThreadPool::worker_loop(int index) {
  trace_thread_name("compute", index + 1);
  t_in_pool = true;
  uint64_t seen = 0;
  while (true) {
    uint64_t e = epoch_.load(std::memory_order_acquire);
    int spins = 0;
    while (e == seen) {
      if (++spins < kSpinIterations) {
        // Spin briefly, then yield: on an oversubscribed machine a pure spin would keep the
        // thread that has the work off the CPU.
        if (spins < kPureSpins) {
          DF_PAUSE();
        } else {
          std::this_thread::yield();
        }
      } else {
        // Sleep until the next job. sleepers_ is raised before re-checking the epoch, and the
        // submitter bumps the epoch before reading sleepers_, so a wake-up is never missed.
        std::unique_lock<std::mutex> l(sleep_mutex_);
        sleepers_.fetch_add(1);
        sleep_cv_.wait(l, [&] { return epoch_.load() != seen; });
        sleepers_.fetch_sub(1);
        spins = 0;
      }
      e = epoch_.load(std::memory_order_acquire);
    }
    seen = e;
    if (stop_.load()) return;
    const auto& fn = *fn_;
    int n = n_tasks_;
    for (int t = next_task_.fetch_add(1); t < n; t = next_task_.fetch_add(1)) fn(t, index);
    active_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(int n_tasks, const std::function<void(int, int)>& fn) {
  if (n_tasks <= 0) return;
  if (t_in_pool || workers_.empty() || n_tasks == 1) {
    for (int t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  std::lock_guard<std::mutex> lock(run_mutex_);
  fn_ = &fn;
  n_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  active_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  epoch_.fetch_add(1);
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> l(sleep_mutex_);
    sleep_cv_.notify_all();
  }
  t_in_pool = true;
  for (int t = next_task_.fetch_add(1); t < n_tasks; t = next_task_.fetch_add(1)) fn(t, 0);
  t_in_pool = false;
  for (int spins = 0; active_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < kPureSpins) {
      DF_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t, int)>& fn, int64_t align,
                              int tasks_per_thread) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  align = std::max<int64_t>(align, 1);
  int64_t chunks = std::min<int64_t>(static_cast<int64_t>(size()) * std::max(1, tasks_per_thread),
                                     (n + grain - 1) / grain);
  if (chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  int64_t per = (n + chunks - 1) / chunks;
  per = (per + align - 1) / align * align;
  chunks = (n + per - 1) / per;
  run(static_cast<int>(chunks), [&](int task, int thread) {
    int64_t b = task * per;
    int64_t e = std::min(n, b + per);
    if (b < e) fn(b, e, thread);
  });
}

namespace {
std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
std::mutex& pool_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

ThreadPool& global_pool() {
  std::lock_guard<std::mutex> lock(pool_mutex());
  auto& p = pool_slot();
  if (!p) p = std::make_unique<ThreadPool>(0);
  return *p;
}

void set_global_threads(int threads) {
  std::lock_guard<std::mutex> lock(pool_mutex());
  auto& p = pool_slot();
  if (p && p->size() == (threads <= 0 ? physical_cores() : threads)) return;
  p = std::make_unique<ThreadPool>(threads);
}

}  // namespace deltafin
