// A small fork-join pool for the forward pass. The caller takes part as thread 0; workers spin
// briefly between jobs (decode issues thousands of short jobs per second) and then sleep on an
// atomic wait. The mapping of task index -> work is fixed by the caller, so results never depend
// on which thread ran a task (and not on the thread count when callers split work by task).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace deltafin {

class ThreadPool {
 public:
  // `threads` counts the caller; 0 means one per physical core.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(task, thread) for every task in [0, n_tasks), tasks claimed dynamically. Blocks until
  // all tasks are done. A call made from inside a task runs serially on that thread.
  void run(int n_tasks, const std::function<void(int task, int thread)>& fn);

  // Splits [0, n) into at most size() contiguous chunks of at least `grain` items (rounded to a
  // multiple of `align`) and runs fn(begin, end, thread) on each.
  // With `tasks_per_thread` > 1 the range is cut finer, so a thread that starts late (or runs
  // slower) does not hold up the others: tasks are claimed dynamically.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& fn,
                    int64_t align = 1, int tasks_per_thread = 1);

 private:
  void stop_workers();  // signals and joins every worker
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one job at a time
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> sleepers_{0};
  std::mutex sleep_mutex_;
  std::condition_variable sleep_cv_;
  std::atomic<int> next_task_{0};
  std::atomic<int> active_{0};
  std::atomic<bool> stop_{false};
  int n_tasks_ = 0;
  const std::function<void(int, int)>* fn_ = nullptr;
};

// Number of physical cores (falls back to logical CPUs when the topology is unknown).
int physical_cores();

// The process-wide pool used by the model; configured once by --threads.
ThreadPool& global_pool();
void set_global_threads(int threads);

}  // namespace deltafin
