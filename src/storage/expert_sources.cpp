#include "storage/expert_sources.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/file_io.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/trace.h"
#include "storage/checkpoint.h"

namespace deltafin {

ExpertSources::ExpertSources(const ExpertDirectory& dir, const Checkpoint& ck, bool direct_io,
                             int readers, const std::vector<std::string>& homes, uint64_t min_piece,
                             std::shared_ptr<ReadGate> model_gate)
    : dir_(dir),
      min_piece_(std::max<uint64_t>(kIoAlign, io_align_up(min_piece))),
      files_(ck, direct_io) {
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
  for (size_t i = 0; i < drives_.size(); ++i)
    drives_[i]->pool = std::make_unique<ReaderPool>(readers, i == kModel ? model_gate : nullptr);
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

std::vector<ExpertSources::Piece> ExpertSources::plan(int layer, int expert, int avoid) const {
  const ExpertLocation& loc = dir_.location(layer, expert);
  const uint64_t size = loc.image_bytes;
  if (drives_.size() == 1) {
    if (avoid == kModel) return {};
    return {{kModel, 0, size}};
  }
  struct Holder {
    int source;
    double queued, bw, share = 0;
  };
  std::vector<Holder> h;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t s = 0; s < drives_.size(); ++s) {
      const Drive& d = *drives_[s];
      if (static_cast<int>(s) == avoid || d.bad.load()) continue;
      if (d.home && d.home->find(layer, expert) == nullptr) continue;
      h.push_back({static_cast<int>(s), static_cast<double>(d.queued), bandwidth_locked(d)});
    }
  }
  if (h.empty()) return {};
  // Read whole: from the holder that would finish it first.
  auto whole = [size](const std::vector<Holder>& hs) -> std::vector<Piece> {
    const auto best = std::min_element(hs.begin(), hs.end(), [&](const Holder& a, const Holder& b) {
      return (a.queued + static_cast<double>(size)) / a.bw <
             (b.queued + static_cast<double>(size)) / b.bw;
    });
    return {{best->source, 0, size}};
  };
  if (h.size() == 1 || loc.image.size() != 1 || size < 2 * min_piece_) return whole(h);
  const std::vector<Holder> all = h;
  // Water-filling: the time T at which the holders, each starting when its queue drains, finish
  // `size` bytes together; a holder whose piece would be under `min_piece` drops out (its
  // queue is too long, or the expert too small to split that far).
  while (true) {
    std::sort(h.begin(), h.end(),
              [](const Holder& a, const Holder& b) { return a.queued / a.bw < b.queued / b.bw; });
    size_t k = h.size();
    double T = 0;
    for (; k >= 1; --k) {
      double q = static_cast<double>(size), bw = 0;
      for (size_t i = 0; i < k; ++i) {
        q += h[i].queued;
        bw += h[i].bw;
      }
      T = q / bw;
      if (T >= h[k - 1].queued / h[k - 1].bw) break;
    }
    h.resize(k);
    size_t smallest = 0;
    for (size_t i = 0; i < h.size(); ++i) {
      h[i].share = T * h[i].bw - h[i].queued;
      if (h[i].share < h[smallest].share) smallest = i;
    }
    if (h.size() == 1 || h[smallest].share >= static_cast<double>(min_piece_)) break;
    h.erase(h.begin() + static_cast<ptrdiff_t>(smallest));
  }
  if (h.size() == 1) return whole(all);
  std::vector<Piece> out;
  uint64_t at = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    const uint64_t end =
        i + 1 == h.size() ? size
                          : std::min(size, at + io_align_down(static_cast<uint64_t>(h[i].share)));
    if (end > at) out.push_back({h[i].source, at, end});
    at = end;
  }
  return out;
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

void ExpertSources::end_read(Drive& d, uint64_t bytes, double seconds, bool ok, bool piece) {
  std::lock_guard<std::mutex> l(mu_);
  if (--d.in_flight == 0) d.busy_s += now_seconds() - d.busy_since;
  if (!ok) {
    d.failures++;
    return;
  }
  d.reads++;
  if (piece) d.pieces++;
  d.bytes_read += bytes;
  d.read_time_s += seconds;
}

void ExpertSources::read_from(int source, const Piece& p, int layer, int expert, uint8_t* image) {
  Drive& d = *drives_[static_cast<size_t>(source)];
  const ExpertLocation& loc = dir_.location(layer, expert);
  const std::string what = fmt::format("expert {} of layer {}", expert, layer);
  begin_read(d);
  TraceSpan span("read", "io",
                 {{"bytes", p.end - p.begin},
                  {"drive", source},
                  {"layer", layer},
                  {"expert", expert},
                  {"queued_us", ReaderPool::current_queued_us()},
                  {"in_flight", ReaderPool::current_in_flight()}});
  Stopwatch sw;
  try {
    if (d.home) {
      const HomeEntry* e = d.home->find(layer, expert);
      if (e == nullptr) fail_io("{} holds no copy of {}", d.name, what);
      d.home->read_piece(*e, p.begin, p.end, image, what);
    } else {
      read_image(files_, loc, p.begin, p.end, image, what);
    }
  } catch (...) {
    end_read(d, 0, sw.elapsed(), false, false);
    throw;
  }
  end_read(d, p.end - p.begin, sw.elapsed(), true, p.end - p.begin < loc.image_bytes);
}

void ExpertSources::read_piece(const Piece& p, int layer, int expert, uint8_t* image, int* served) {
  int s = p.source;
  for (;;) {
    try {
      read_from(s, p, layer, expert, image);
      *served = s;
      return;
    } catch (const IoError& e) {
      if (s == kModel) throw;
      mark_bad(s, e.what());
      const std::vector<Piece> next = plan(layer, expert, s);
      s = next.empty() ? kModel : next.front().source;
    }
  }
}

std::vector<const uint8_t*> ExpertSources::finish(int layer, int expert, uint8_t* image,
                                                  const std::vector<Piece>& served) {
  const ExpertLocation& loc = dir_.location(layer, expert);
  const HomeEntry* entry = nullptr;
  for (const auto& p : served) {
    if (p.source != kModel && entry == nullptr)
      entry = drives_[static_cast<size_t>(p.source)]->home->find(layer, expert);
  }
  if (entry == nullptr || expert_checksum(loc, image) == entry->checksum)
    return loc.tensors_in(image);
  // A home delivered damaged bytes: keep what the homes sent, read their pieces again from the
  // model folder, and mark bad the homes whose bytes differed.
  const std::string what = fmt::format("expert {} of layer {}", expert, layer);
  const std::vector<uint8_t> sent(image, image + loc.image_bytes);
  for (const auto& p : served) {
    if (p.source != kModel) read_from(kModel, p, layer, expert, image);
  }
  const bool model_agrees = expert_checksum(loc, image) == entry->checksum;
  for (const auto& p : served) {
    if (p.source == kModel) continue;
    // When the model folder's bytes fail too, it changed since `place`: no copy is good.
    if (model_agrees && same_expert_bytes(loc, sent.data(), image, p.begin, p.end)) continue;
    Drive& d = *drives_[static_cast<size_t>(p.source)];
    {
      std::lock_guard<std::mutex> l(mu_);
      d.failures++;
    }
    mark_bad(p.source,
             fmt::format("checksum of {} in {} failed (the copy is damaged); read again from the "
                         "model folder",
                         what, d.home->file_of(*d.home->find(layer, expert))));
  }
  return loc.tensors_in(image);
}

std::vector<const uint8_t*> ExpertSources::read_whole(int source, int layer, int expert,
                                                      uint8_t* image) {
  const ExpertLocation& loc = dir_.location(layer, expert);
  read_from(source, {source, 0, loc.image_bytes}, layer, expert, image);
  Drive& d = *drives_[static_cast<size_t>(source)];
  if (d.home) {
    try {
      d.home->check(*d.home->find(layer, expert), image,
                    fmt::format("expert {} of layer {}", expert, layer));
    } catch (const IoError&) {
      std::lock_guard<std::mutex> l(mu_);
      d.failures++;
      throw;
    }
  }
  return loc.tensors_in(image);
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
    s.split_reads = d->pieces;
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
