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

ReaderPool::ReaderPool(int threads) {
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
    (p == Priority::kDemand ? demand_ : background_)
        .push_back(Task{std::move(task), trace_on() ? reader_pool_now_ns() : -1});
    trace_counter("read queue", {{"queued", g_reads_queued.fetch_add(1) + 1}});
  }
  cv_.notify_one();
}

void ReaderPool::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    g_reads_queued -= static_cast<int64_t>(demand_.size() + background_.size());
    demand_.clear();
    background_.clear();
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

double ReaderPool::busy_seconds() const {
  std::lock_guard<std::mutex> l(mu_);
  return busy_s_;
}

void ReaderPool::loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    cv_.wait(l, [&] { return stop_ || !demand_.empty() || !background_.empty(); });
    if (stop_) return;
    auto& q = demand_.empty() ? background_ : demand_;
    Task task = std::move(q.front());
    q.pop_front();
    trace_counter("read queue", {{"queued", g_reads_queued.fetch_sub(1) - 1}});
    t_reader_in_flight = ++running_;
    l.unlock();
    t_reader_queued_us =
        task.submitted_ns >= 0 ? (reader_pool_now_ns() - task.submitted_ns) / 1000 : -1;
    Stopwatch sw;
    task.run();  // tasks report their own errors; they do not throw
    const double t = sw.elapsed();
    l.lock();
    --running_;
    busy_s_ += t;
  }
}

}  // namespace deltafin
