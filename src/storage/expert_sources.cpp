#include "storage/expert_sources.h"

#include <algorithm>

#include "core/error.h"
#include "core/file_io.h"
#include "core/log.h"
#include "core/timer.h"
#include "storage/checkpoint.h"

namespace deltafin {

ExpertSources::ExpertSources(const ExpertDirectory& dir, const Checkpoint& ck, bool direct_io,
                             int readers, const std::vector<std::string>& homes)
    : dir_(dir), files_(ck, direct_io) {
  auto model = std::make_unique<Drive>();
  model->name = "model";
  model->experts = static_cast<uint64_t>(dir.num_layers() - dir.first_moe_layer()) *
                   static_cast<uint64_t>(dir.num_experts());
  drives_.push_back(std::move(model));
  if (!homes.empty()) {
    const std::string fingerprint = checkpoint_fingerprint(ck);
    for (const auto& h : homes) {
      try {
        auto d = std::make_unique<Drive>();
        d->home = std::make_unique<ExpertHome>(h, fingerprint, dir, direct_io);
        d->name = h;
        d->probe = d->home->manifest().probe_bytes_per_s;
        d->experts = d->home->manifest().experts.size();
        if (drives_[kModel]->probe <= 0)
          drives_[kModel]->probe = d->home->manifest().model_probe_bytes_per_s;
        drives_.push_back(std::move(d));
      } catch (const Error& e) {
        log_warn("home {} is not used: {}; its experts are read from the model folder", h,
                 e.what());
      }
    }
  }
  for (auto& d : drives_) d->pool = std::make_unique<ReaderPool>(readers);
}

ExpertSources::~ExpertSources() {
  stop();
}

void ExpertSources::stop() {
  for (auto& d : drives_) d->pool->stop();
}

double ExpertSources::bandwidth_locked(const Drive& d) const {
  double busy = d.busy_s;
  if (d.in_flight > 0) busy += now_seconds() - d.busy_since;
  if (busy >= 1.0 && d.bytes_read > 0) return static_cast<double>(d.bytes_read) / busy;
  return d.probe > 0 ? d.probe : 1e9;
}

int ExpertSources::choose(int layer, int expert, int avoid) const {
  if (drives_.size() == 1) return avoid == kModel ? -1 : kModel;
  const uint64_t bytes = dir_.location(layer, expert).bytes;
  std::lock_guard<std::mutex> l(mu_);
  int best = -1;
  double best_t = 0;
  for (size_t s = 0; s < drives_.size(); ++s) {
    const Drive& d = *drives_[s];
    if (static_cast<int>(s) == avoid || d.bad.load()) continue;
    if (d.home && d.home->find(layer, expert) == nullptr) continue;
    const double t = static_cast<double>(d.queued + bytes) / bandwidth_locked(d);
    if (best < 0 || t < best_t) {
      best = static_cast<int>(s);
      best_t = t;
    }
  }
  return best;
}

int ExpertSources::copies(int layer, int expert) const {
  int n = 0;
  for (const auto& d : drives_) {
    if (!d->bad.load() && (!d->home || d->home->find(layer, expert) != nullptr)) ++n;
  }
  return n;
}

void ExpertSources::submit(int source, ReaderPool::Priority p, uint64_t bytes,
                           std::function<void()> task) {
  Drive& d = *drives_[static_cast<size_t>(source)];
  {
    std::lock_guard<std::mutex> l(mu_);
    d.queued += bytes;
  }
  d.pool->submit(p, [this, &d, bytes, task = std::move(task)] {
    task();
    std::lock_guard<std::mutex> l(mu_);
    d.queued -= std::min(d.queued, bytes);
  });
}

void ExpertSources::begin_read(Drive& d) {
  std::lock_guard<std::mutex> l(mu_);
  if (d.in_flight++ == 0) d.busy_since = now_seconds();
}

void ExpertSources::end_read(Drive& d, uint64_t bytes, double seconds, bool ok) {
  std::lock_guard<std::mutex> l(mu_);
  if (--d.in_flight == 0) d.busy_s += now_seconds() - d.busy_since;
  if (!ok) {
    d.failures++;
    return;
  }
  d.reads++;
  d.bytes_read += bytes;
  d.read_time_s += seconds;
}

std::vector<const uint8_t*> ExpertSources::read(int source, int layer, int expert, uint8_t* buf) {
  Drive& d = *drives_[static_cast<size_t>(source)];
  const ExpertLocation& loc = dir_.location(layer, expert);
  const std::string what = fmt::format("expert {} of layer {}", expert, layer);
  std::vector<const uint8_t*> ptrs;
  begin_read(d);
  Stopwatch sw;
  try {
    if (d.home) {
      const HomeEntry* e = d.home->find(layer, expert);
      if (e == nullptr) fail_io("{} holds no copy of {}", d.name, what);
      d.home->read(*e, buf, what);
      uint64_t off = 0;
      for (const auto& r : loc.ranges) {
        ptrs.push_back(buf + off);
        off += r.size;
      }
    } else {
      // One aligned read of [offset, offset + size) at `pos` in the slot; returns where it
      // starts.
      auto read_span = [&](int shard, uint64_t offset, uint64_t size, uint64_t pos) -> uint64_t {
        const uint64_t a0 = io_align_down(offset), a1 = io_align_up(offset + size);
        files_.read_aligned(shard, a0, a1 - a0, buf + pos, offset + size - a0, what);
        return pos + (offset - a0);
      };
      if (loc.contiguous()) {
        const ByteRange s = loc.span();
        uint64_t off = read_span(s.shard, s.offset, s.size, 0);
        for (const auto& r : loc.ranges) {
          ptrs.push_back(buf + off);
          off += r.size;
        }
      } else {
        uint64_t pos = 0;
        for (const auto& r : loc.ranges) {
          ptrs.push_back(buf + read_span(r.shard, r.offset, r.size, pos));
          pos += io_align_up(r.offset + r.size) - io_align_down(r.offset);
        }
      }
    }
  } catch (...) {
    end_read(d, 0, sw.elapsed(), false);
    throw;
  }
  end_read(d, loc.bytes, sw.elapsed(), true);
  return ptrs;
}

std::vector<const uint8_t*> ExpertSources::read_with_fallback(int source, int layer, int expert,
                                                              uint8_t* buf, int* served) {
  int s = source;
  for (;;) {
    try {
      auto ptrs = read(s, layer, expert, buf);
      *served = s;
      return ptrs;
    } catch (const IoError& e) {
      if (s == kModel) throw;
      mark_bad(s, e.what());
      s = choose(layer, expert, s);
      if (s < 0) s = kModel;
    }
  }
}

void ExpertSources::count_hedge(int source, bool won) {
  std::lock_guard<std::mutex> l(mu_);
  Drive& d = *drives_[static_cast<size_t>(source)];
  d.hedges++;
  if (won) d.hedge_wins++;
}

void ExpertSources::mark_bad(int source, const std::string& why) {
  if (source == kModel) return;
  Drive& d = *drives_[static_cast<size_t>(source)];
  if (d.bad.exchange(true)) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    d.bad_reason = why;
  }
  log_warn(
      "home {} is not used for the rest of this run: {}; its experts are read from the model "
      "folder or another home",
      d.name, why);
}

double ExpertSources::read_seconds(int source, uint64_t bytes) const {
  std::lock_guard<std::mutex> l(mu_);
  const Drive& d = *drives_[static_cast<size_t>(source)];
  if (d.reads >= 4 && d.bytes_read > 0)
    return d.read_time_s * static_cast<double>(bytes) / static_cast<double>(d.bytes_read);
  return static_cast<double>(bytes) / bandwidth_locked(d);
}

double ExpertSources::bandwidth() const {
  std::lock_guard<std::mutex> l(mu_);
  double sum = 0;
  for (const auto& d : drives_) {
    if (!d->bad.load()) sum += bandwidth_locked(*d);
  }
  return sum;
}

std::vector<SourceStats> ExpertSources::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<SourceStats> out;
  for (const auto& d : drives_) {
    SourceStats s;
    s.name = d->name;
    s.probe_bytes_per_s = d->probe;
    s.experts = d->experts;
    s.reads = d->reads;
    s.bytes_read = d->bytes_read;
    s.busy_s = d->busy_s + (d->in_flight > 0 ? now_seconds() - d->busy_since : 0.0);
    s.hedges = d->hedges;
    s.hedge_wins = d->hedge_wins;
    s.failures = d->failures;
    s.bad = d->bad.load();
    s.bad_reason = d->bad_reason;
    out.push_back(std::move(s));
  }
  return out;
}

double ExpertSources::busy_seconds() const {
  double t = 0;
  for (const auto& d : drives_) t += d->pool->busy_seconds();
  return t;
}

std::string ExpertSources::describe() const {
  if (drives_.size() == 1) return "";
  std::string s = fmt::format(", {} home{} (", drives_.size() - 1, drives_.size() == 2 ? "" : "s");
  for (size_t i = 1; i < drives_.size(); ++i)
    s += fmt::format("{}{}: {} experts", i > 1 ? "; " : "", drives_[i]->name, drives_[i]->experts);
  return s + ")";
}

bool ExpertSources::direct() const {
  if (!files_.direct()) return false;
  for (size_t i = 1; i < drives_.size(); ++i) {
    if (!drives_[i]->home->direct()) return false;
  }
  return true;
}

}  // namespace deltafin
