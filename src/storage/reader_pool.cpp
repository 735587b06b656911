#include "storage/reader_pool.h"

#include <algorithm>

#include "core/timer.h"

namespace deltafin {

ReaderPool::ReaderPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { loop(); });
}

ReaderPool::~ReaderPool() {
  stop();
}

void ReaderPool::submit(Priority p, std::function<void()> task) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return;
    (p == Priority::kDemand ? demand_ : background_).push_back(std::move(task));
  }
  cv_.notify_one();
}

void ReaderPool::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
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
    std::function<void()> task = std::move(q.front());
    q.pop_front();
    l.unlock();
    Stopwatch sw;
    task();  // tasks report their own errors; they do not throw
    const double t = sw.elapsed();
    l.lock();
    busy_s_ += t;
  }
}

}  // namespace deltafin
