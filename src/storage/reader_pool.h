// The reader threads behind the trunk streamer and the expert store: one queue of read tasks in
// three priorities (demand, then read-ahead, then background), served by a few threads. Disk
// reads block, so they run here and never on the compute pool. Tasks carry their own completion
// bookkeeping (under their owner's lock); the pool only orders and runs them. A task that was
// cancelled after it was queued finds that out itself when it runs (its owner's state says so)
// and returns.
//
// The trunk streamer and the expert store each have their own pool (each stops its own before
// freeing what its reads write into), yet on the model folder they read one drive. A ReadGate
// shared by the pools of one drive orders them as one queue would: while any of them has a
// demand read queued or running (the experts a pass waits for), the others start no read-ahead
// task (the trunk units of later layers), so the pass's critical path gets the drive first.
// Waiting threads sleep on their pool's condition variable; the gate wakes them when its last
// demand read ends. A pool's own demand tasks are never held back.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace deltafin {

class ReaderPool;

// Demand reads in flight on one drive over all the pools that share it (see above).
class ReadGate {
 public:
  // Whether some demand read is queued or running.
  bool busy() const { return demand_.load() > 0; }

 private:
  friend class ReaderPool;
  void begin() { demand_.fetch_add(1); }
  void end();  // wakes the gated pools when the last one ends
  void join(ReaderPool* p);
  void leave(ReaderPool* p);
  std::atomic<int64_t> demand_{0};
  std::mutex mu_;
  std::vector<ReaderPool*> pools_;
};

class ReaderPool {
 public:
  // kAhead: reads wanted soon but not yet waited on (the trunk's read-ahead); they yield to
  // demand reads of every pool sharing the gate.
  enum class Priority { kDemand, kAhead, kBackground };

  explicit ReaderPool(int threads, std::shared_ptr<ReadGate> gate = nullptr);
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
  friend class ReadGate;
  struct Task {
    std::function<void()> run;
    int64_t submitted_ns = -1;  // steady clock, only while tracing
    bool gated = false;         // counted in the gate until it ends
  };
  void loop();
  void wake();  // the gate cleared
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> demand_, ahead_, background_;
  std::shared_ptr<ReadGate> gate_;
  int running_ = 0;
  std::vector<std::thread> threads_;
  bool stop_ = false;
  double busy_s_ = 0;
};

}  // namespace deltafin
