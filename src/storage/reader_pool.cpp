#include "storage/reader_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>

#include "core/timer.h"
#include "core/trace.h"

namespace deltafin {
namespace {
// Reader threads are numbered across pools (one pool per drive, one for the trunk), and the
// queue-depth counter is the sum over pools: what is waiting for the drives in all.
std::atomic<int> g_reader_serial{0};
std::atomic<int64_t> g_reads_queued{0};
// The running task's queue time and its pool's running count (ReaderPool::current_*).
thread_local int64_t t_reader_queued_us = -1;
thread_local int t_reader_in_flight = 0;
int64_t reader_pool_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

int64_t ReaderPool::current_queued_us() {
  return t_reader_queued_us;
}
int ReaderPool::current_in_flight() {
  return t_reader_in_flight;
}

void ReadGate::end() {
  if (demand_.fetch_sub(1) != 1) return;
  std::lock_guard<std::mutex> l(mu_);
  for (ReaderPool* p : pools_) p->wake();
}

void ReadGate::join(ReaderPool* p) {
  std::lock_guard<std::mutex> l(mu_);
  pools_.push_back(p);
}

void ReadGate::leave(ReaderPool* p) {
  std::lock_guard<std::mutex> l(mu_);
  pools_.erase(std::remove(pools_.begin(), pools_.end(), p), pools_.end());
}

void ReaderPool::wake() {
  // Under the pool's lock, so a thread that saw the gate busy is already waiting.
  std::lock_guard<std::mutex> l(mu_);
  cv_.notify_all();
}

ReaderPool::ReaderPool(int threads, std::shared_ptr<ReadGate> gate) : gate_(std::move(gate)) {
  if (gate_) gate_->join(this);
  for (int i = 0; i < std::max(1, threads); ++i) {
    threads_.emplace_back([this, n = g_reader_serial.fetch_add(1) + 1] {
      trace_thread_name("reader", n);
      loop();
    });
  }
}

ReaderPool::~ReaderPool() {
  stop();
}

void ReaderPool::submit(Priority p, std::function<void()> task) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return;
    const bool gated = gate_ != nullptr && p == Priority::kDemand;
    if (gated) gate_->begin();
    auto& q = p == Priority::kDemand ? demand_ : p == Priority::kAhead ? ahead_ : background_;
    q.push_back(Task{std::move(task), trace_on() ? reader_pool_now_ns() : -1, gated});
    trace_counter("read queue", {{"queued", g_reads_queued.fetch_add(1) + 1}});
  }
  cv_.notify_one();
}

void ReaderPool::stop() {
  int64_t gated = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    g_reads_queued -= static_cast<int64_t>(demand_.size() + ahead_.size() + background_.size());
    for (const Task& t : demand_) gated += t.gated;
    demand_.clear();
    ahead_.clear();
    background_.clear();
  }
  cv_.notify_all();
  // The dropped demand reads leave the gate outside our lock (end() may take it to wake us).
  for (int64_t i = 0; i < gated; ++i) gate_->end();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  if (gate_) gate_->leave(this);
}

double ReaderPool::busy_seconds() const {
  std::lock_guard<std::mutex> l(mu_);
  return busy_s_;
}

void ReaderPool::loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    // Read-ahead tasks wait while a pool sharing the gate has demand reads; background tasks
    // (expert prefetch) keep their old place: after this pool's own queued demand.
    std::deque<Task>* q = nullptr;
    cv_.wait(l, [&] {
      if (stop_) return true;
      if (!demand_.empty()) {
        q = &demand_;
      } else if (!ahead_.empty() && (gate_ == nullptr || !gate_->busy())) {
        q = &ahead_;
      } else if (!background_.empty()) {
        q = &background_;
      } else {
        q = nullptr;
      }
      return q != nullptr;
    });
    if (stop_) return;
    Task task = std::move(q->front());
    q->pop_front();
    trace_counter("read queue", {{"queued", g_reads_queued.fetch_sub(1) - 1}});
    t_reader_in_flight = ++running_;
    l.unlock();
    t_reader_queued_us =
        task.submitted_ns >= 0 ? (reader_pool_now_ns() - task.submitted_ns) / 1000 : -1;
    Stopwatch sw;
    task.run();  // tasks report their own errors; they do not throw
    const double t = sw.elapsed();
    if (task.gated) gate_->end();  // before taking our lock: end() may take it to wake us
    l.lock();
    --running_;
    busy_s_ += t;
  }
}

}  // namespace deltafin
