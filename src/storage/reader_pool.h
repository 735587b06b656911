// The reader threads behind the trunk streamer and the expert store: one queue of read tasks in
// two priorities (demand before background), served by a few threads. Disk reads block, so they
// run here and never on the compute pool. Tasks carry their own completion bookkeeping (under
// their owner's lock); the pool only orders and runs them. A task that was cancelled after it
// was queued finds that out itself when it runs (its owner's state says so) and returns.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace deltafin {

class ReaderPool {
 public:
  enum class Priority { kDemand, kBackground };

  explicit ReaderPool(int threads);
  ~ReaderPool();  // stop()
  ReaderPool(const ReaderPool&) = delete;
  ReaderPool& operator=(const ReaderPool&) = delete;

  void submit(Priority p, std::function<void()> task);
  // Drops queued tasks and joins the threads after their running tasks end. Owners call it
  // before freeing what tasks write into.
  void stop();
  int size() const { return static_cast<int>(threads_.size()); }
  // Seconds the threads spent running tasks.
  double busy_seconds() const;
  // For the task running on the calling reader thread, what the trace's read spans carry
  // (docs/TRACING.md): the microseconds it waited in the queue (-1 when tracing was off at its
  // submission: no clock is read then) and how many of this pool's tasks were running when it
  // started, itself included (the reads in flight on the pool's drive).
  static int64_t current_queued_us();
  static int current_in_flight();

 private:
  struct Task {
    std::function<void()> run;
    int64_t submitted_ns = -1;  // steady clock, only while tracing
  };
  void loop();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> demand_, background_;
  int running_ = 0;
  std::vector<std::thread> threads_;
  bool stop_ = false;
  double busy_s_ = 0;
};

}  // namespace deltafin
