#include "experts/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>

#include "core/error.h"
#include "core/file_io.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/timer.h"
#include "core/weight_buffer.h"
#include "model/checkpoint.h"

namespace deltafin {

namespace {
// Bytes a slot needs for one expert: each range widened to the 4 KiB grid (contiguous ranges
// share one widened span).
uint64_t slot_need(const ExpertLocation& loc) {
  if (loc.contiguous()) {
    const ByteRange s = loc.span();
    return io_align_up(s.offset + s.size) - io_align_down(s.offset);
  }
  uint64_t n = 0;
  for (const auto& r : loc.ranges) n += io_align_up(r.offset + r.size) - io_align_down(r.offset);
  return n;
}
}  // namespace

CachePolicy parse_cache_policy(const std::string& s) {
  if (s == "lru") return CachePolicy::kLRU;
  if (s == "lfu") return CachePolicy::kLFU;
  if (s == "pinned") return CachePolicy::kPinned;
  fail_arg("--cache-policy {}: expected lru, lfu or pinned", s);
}

const char* cache_policy_name(CachePolicy p) {
  switch (p) {
    case CachePolicy::kLRU:
      return "lru";
    case CachePolicy::kLFU:
      return "lfu";
    case CachePolicy::kPinned:
      return "pinned";
  }
  return "?";
}

uint64_t ExpertStore::slot_bytes_for(const ExpertDirectory& dir, const ModelConfig& c) {
  uint64_t n = 0;
  for (int l = static_cast<int>(c.first_k_dense); l < c.num_layers; ++l) {
    for (int e = 0; e < c.moe.num_experts; ++e) n = std::max(n, slot_need(dir.location(l, e)));
  }
  return io_align_up(n);
}

uint64_t ExpertStore::min_cache_bytes(const ModelConfig& c, uint64_t expert_bytes) {
  return static_cast<uint64_t>(c.moe.top_k) * io_align_up(expert_bytes + 2 * kIoAlign);
}

// ---------------------------------------------------------------------------------------------

class ExpertStore::Batch : public ExpertBatch {
 public:
  Batch(ExpertStore& s, std::vector<int64_t> keys, std::vector<int> slots)
      : s_(s), keys_(std::move(keys)), slot_(std::move(slots)), taken_(keys_.size(), false) {}

  ~Batch() override {
    std::lock_guard<std::mutex> l(s_.mu_);
    for (size_t i = 0; i < keys_.size(); ++i) {
      if (!taken_[i] && slot_[i] >= 0) {
        s_.slots_[static_cast<size_t>(slot_[i])].pins--;
      }
    }
    s_.cv_.notify_all();
  }

  bool next(size_t& index, ExpertHandle& handle) override {
    handle.reset();  // releasing the caller's previous expert takes the lock itself
    std::unique_lock<std::mutex> l(s_.mu_);
    double waited = 0;
    while (true) {
      if (n_taken_ == keys_.size()) {
        s_.stats_.io_wait_s += waited;
        return false;
      }
      // Schedule what did not fit before (slots free up as compute releases experts).
      for (size_t i = 0; i < keys_.size(); ++i) {
        if (taken_[i] || slot_[i] >= 0) continue;
        auto it = s_.where_.find(keys_[i]);
        if (it != s_.where_.end()) {
          slot_[i] = it->second;
          s_.slots_[static_cast<size_t>(it->second)].pins++;
          continue;
        }
        int sl = s_.take_slot_locked(keys_[i], false);
        if (sl < 0) break;
        s_.slots_[static_cast<size_t>(sl)].pins++;
        s_.start_read_locked(sl, keys_[i], false);
        slot_[i] = sl;
      }
      for (size_t i = 0; i < keys_.size(); ++i) {
        if (taken_[i] || slot_[i] < 0) continue;
        Slot& sl = s_.slots_[static_cast<size_t>(slot_[i])];
        if (sl.state == SlotState::kReady) {
          taken_[i] = true;
          ++n_taken_;
          index = i;
          handle = s_.handle_locked(slot_[i]);  // takes over this batch's pin
          s_.stats_.io_wait_s += waited;
          return true;
        }
        if (sl.state == SlotState::kError) {
          taken_[i] = true;
          ++n_taken_;
          std::string msg = sl.error;
          sl.pins--;
          if (sl.pins == 0) {  // forget the failed expert so a later request retries it
            s_.where_.erase(sl.key);
            sl.key = -1;
            sl.state = SlotState::kEmpty;
          }
          s_.stats_.io_wait_s += waited;
          throw IoError(msg);
        }
      }
      Stopwatch sw;
      s_.cv_.wait(l);
      waited += sw.elapsed();
    }
  }

 private:
  ExpertStore& s_;
  std::vector<int64_t> keys_;
  std::vector<int> slot_;
  std::vector<bool> taken_;
  size_t n_taken_ = 0;
};

// ---------------------------------------------------------------------------------------------

ExpertStore::ExpertStore(const ModelConfig& c, const Checkpoint& ck, ExpertFormat format,
                         StoreOptions options)
    : ck_(ck), dir_(c, ck, format), opt_(std::move(options)) {
  slot_bytes_ = slot_bytes_for(dir_, c);
  size_t n_slots = slot_bytes_ > 0 ? static_cast<size_t>(opt_.cache_bytes / slot_bytes_) : 0;
  if (opt_.cache_slots > 0) n_slots = opt_.cache_slots;
  const size_t need = static_cast<size_t>(c.moe.top_k);
  if (dir_.num_layers() > dir_.first_moe_layer() && n_slots < need) {
    fail_arg("expert cache of {} bytes holds {} experts; one pass of one layer needs {} ({} bytes)",
             opt_.cache_bytes, n_slots, need, need * slot_bytes_);
  }
  slots_.resize(n_slots);
  const size_t n_keys =
      static_cast<size_t>(dir_.num_layers()) * static_cast<size_t>(dir_.num_experts());
  heat_.assign(n_keys, 0);
  key_hits_.assign(n_keys, 0);
  key_misses_.assign(n_keys, 0);
  predicted_.assign(n_keys, 0);
  recall_.assign(static_cast<size_t>(dir_.num_layers()), {});
  for (const auto& m : ck.shards()) {
    paths_.push_back(m.path());
    fds_.push_back(open_for_reading(m.path(), opt_.direct_io, &direct_ok_));
  }
  if (!opt_.direct_io) direct_ok_ = false;
  // Heat statistics: counts per (layer, expert), persisted across runs.
  if (!opt_.heat_file.empty()) {
    std::ifstream in(opt_.heat_file, std::ios::binary);
    char magic[8] = {};
    uint64_t dims[2] = {};
    if (in.read(magic, 8) && std::memcmp(magic, "DFHEAT1", 8) == 0 &&
        in.read(reinterpret_cast<char*>(dims), 16) &&
        dims[0] == static_cast<uint64_t>(dir_.num_layers()) &&
        dims[1] == static_cast<uint64_t>(dir_.num_experts())) {
      in.read(reinterpret_cast<char*>(heat_.data()),
              static_cast<std::streamsize>(heat_.size() * 8));
      if (!in) std::fill(heat_.begin(), heat_.end(), 0);
    }
  }
  if (opt_.policy == CachePolicy::kPinned) {
    // The hottest experts (by persisted heat) stay resident once loaded.
    std::vector<size_t> order(n_keys);
    std::iota(order.begin(), order.end(), 0);
    const size_t n_hot =
        std::min(n_keys, static_cast<size_t>(opt_.pin_fraction * static_cast<double>(n_slots)));
    std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(n_hot), order.end(),
                      [&](size_t a, size_t b) { return heat_[a] > heat_[b]; });
    for (size_t i = 0; i < n_hot; ++i) {
      if (heat_[order[i]] > 0) predicted_[order[i]] |= 2;  // bit 1: hot
    }
  }
  const int readers = std::max(1, opt_.readers);
  for (int i = 0; i < readers; ++i) readers_.emplace_back([this] { reader_loop(); });
}

ExpertStore::~ExpertStore() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    demand_q_.clear();
    prefetch_q_.clear();
  }
  work_cv_.notify_all();
  for (auto& t : readers_) t.join();
  try {
    save_heat();
  } catch (const std::exception& e) {
    log_warn("could not save expert heat statistics: {}", e.what());
  }
  for (auto& s : slots_) std::free(s.buf);
  for (int fd : fds_) ::close(fd);
}

ExpertLocation ExpertStore::locate(int layer, int expert) const {
  return dir_.location(layer, expert);
}

int ExpertStore::take_slot_locked(int64_t key, bool for_prefetch) {
  int best = -1;
  auto better = [&](const Slot& a, const Slot& b) {         // is a a better victim than b?
    if (a.prefetched != b.prefetched) return a.prefetched;  // unused predictions go first
    if (opt_.policy == CachePolicy::kLFU && a.freq != b.freq) return a.freq < b.freq;
    return a.last_use < b.last_use;
  };
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.state == SlotState::kEmpty && s.key < 0) {
      best = static_cast<int>(i);
      break;
    }
    if (s.pins > 0 || s.state == SlotState::kLoading || s.hot) continue;
    if (for_prefetch && !s.prefetched && s.last_use + 1 >= tick_)
      continue;  // never evict this pass's experts for a guess
    if (best < 0 || better(s, slots_[static_cast<size_t>(best)])) best = static_cast<int>(i);
  }
  if (best < 0) return -1;
  Slot& v = slots_[static_cast<size_t>(best)];
  if (v.key >= 0) {
    if (v.prefetched)
      stats_.prefetch_wasted_bytes += dir_.location(static_cast<int>(v.key / dir_.num_experts()),
                                                    static_cast<int>(v.key % dir_.num_experts()))
                                          .bytes;
    where_.erase(v.key);
  }
  if (v.buf == nullptr) {
    v.buf = alloc_weight_buffer(slot_bytes_, "an expert slot");
  }
  v.key = key;
  v.state = SlotState::kEmpty;
  v.prefetched = false;
  v.hot = (predicted_[static_cast<size_t>(key)] & 2) != 0;
  v.error.clear();
  v.weights.reset();
  where_[key] = best;
  return best;
}

void ExpertStore::start_read_locked(int slot, int64_t key, bool prefetch) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  s.state = SlotState::kLoading;
  s.prefetched = prefetch;
  (prefetch ? prefetch_q_ : demand_q_).push_back({slot, key, prefetch});
  if (prefetch) {
    stats_.prefetch_issued++;
  } else {
    stats_.misses++;
    key_misses_[static_cast<size_t>(key)]++;
  }
  work_cv_.notify_one();
}

void ExpertStore::reader_loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    work_cv_.wait(l, [&] { return stop_ || !demand_q_.empty() || !prefetch_q_.empty(); });
    if (stop_) return;
    Job j;
    if (!demand_q_.empty()) {
      j = demand_q_.front();
      demand_q_.pop_front();
    } else {
      j = prefetch_q_.front();
      prefetch_q_.pop_front();
    }
    Slot& s = slots_[static_cast<size_t>(j.slot)];
    if (s.key != j.key || s.state != SlotState::kLoading) continue;  // cancelled
    l.unlock();
    std::string err;
    Stopwatch sw;
    try {
      read_expert(s, j.key);
    } catch (const std::exception& e) {
      err = e.what();
    }
    const double t = sw.elapsed();
    l.lock();
    stats_.read_s += t;
    if (err.empty()) {
      s.state = SlotState::kReady;
      const ExpertLocation& loc = dir_.location(static_cast<int>(j.key / dir_.num_experts()),
                                                static_cast<int>(j.key % dir_.num_experts()));
      stats_.bytes_read += loc.bytes;
    } else {
      s.state = SlotState::kError;
      s.error = err;
    }
    cv_.notify_all();
  }
}

void ExpertStore::read_expert(Slot& slot, int64_t key) {
  const int layer = static_cast<int>(key / dir_.num_experts()),
            expert = static_cast<int>(key % dir_.num_experts());
  const ExpertLocation& loc = dir_.location(layer, expert);
  std::vector<const uint8_t*> ptrs;
  auto read_span = [&](int shard, uint64_t offset, uint64_t size, uint64_t pos) -> uint64_t {
    const uint64_t a0 = io_align_down(offset), a1 = io_align_up(offset + size);
    uint64_t got = 0;
    const uint64_t need = offset + size - a0;
    for (;;) {
      const ReadResult rd =
          read_at(fds_[static_cast<size_t>(shard)], slot.buf + pos + got, a1 - a0 - got, a0 + got);
      got += rd.bytes;
      if (rd.error == 0) break;                // all of it, or the end of the file
      if (rd.error == EINVAL && direct_ok_) {  // the file system refused O_DIRECT after all
        int fd = ::open(paths_[static_cast<size_t>(shard)].c_str(), O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
          ::close(fds_[static_cast<size_t>(shard)]);
          fds_[static_cast<size_t>(shard)] = fd;
          continue;
        }
      }
      fail_io("reading expert {} of layer {} from {} at offset {}: {}", expert, layer,
              paths_[static_cast<size_t>(shard)], a0 + got, std::strerror(rd.error));
    }
    if (got < need) {
      fail_io(
          "short read of expert {} of layer {} from {}: {} of {} bytes at offset {} (the file is "
          "truncated or was replaced)",
          expert, layer, paths_[static_cast<size_t>(shard)], got, need, a0);
    }
    return pos + (offset - a0);
  };
  if (loc.contiguous()) {
    const ByteRange s = loc.span();
    uint64_t base = read_span(s.shard, s.offset, s.size, 0);
    uint64_t off = base;
    for (const auto& r : loc.ranges) {
      ptrs.push_back(slot.buf + off);
      off += r.size;
    }
  } else {
    uint64_t pos = 0;
    for (const auto& r : loc.ranges) {
      uint64_t at = read_span(r.shard, r.offset, r.size, pos);
      ptrs.push_back(slot.buf + at);
      pos += io_align_up(r.offset + r.size) - io_align_down(r.offset);
    }
  }
  slot.weights = std::make_shared<ExpertWeights>(dir_.weights_from(ptrs));
}

void ExpertStore::unpin(int slot) {
  std::lock_guard<std::mutex> l(mu_);
  slots_[static_cast<size_t>(slot)].pins--;
  cv_.notify_all();
}

ExpertHandle ExpertStore::handle_locked(int slot) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  s.last_use = tick_;
  s.freq++;
  const ExpertWeights* w = s.weights.get();
  auto keep = s.weights;  // the views stay alive while the handle does
  return ExpertHandle(w, [this, slot, keep](const ExpertWeights*) mutable {
    keep.reset();
    unpin(slot);
  });
}

void ExpertStore::check_files_locked() {
  const double now = now_seconds();
  if (now - last_file_check_ < 1.0) return;
  last_file_check_ = now;
  for (size_t i = 0; i < paths_.size(); ++i) {
    FileIdentity id;
    try {
      id = file_identity(paths_[i]);
    } catch (const IoError&) {
      fail_io("{} disappeared while running", paths_[i]);
    }
    const FileIdentity& was = ck_.shards()[i].identity();
    if (!(id == was)) {
      fail_io(
          "{} was replaced or changed while running (size {} -> {}); restart to use the new file",
          paths_[i], was.size, id.size);
    }
  }
}

std::unique_ptr<ExpertBatch> ExpertStore::request(int layer, std::span<const int> experts) {
  std::lock_guard<std::mutex> l(mu_);
  check_files_locked();
  ++tick_;
  std::vector<int64_t> keys;
  for (int e : experts) {
    dir_.location(layer, e);  // validates the id
    keys.push_back(key_of(layer, e));
  }
  // Prediction bookkeeping for this layer: recall, then cancel or demote what was not chosen.
  bool had_prediction = false;
  for (int e = 0; e < dir_.num_experts(); ++e)
    had_prediction |= (predicted_[static_cast<size_t>(key_of(layer, e))] & 1) != 0;
  if (had_prediction) {
    LayerRecall& r = recall_[static_cast<size_t>(layer)];
    r.requested += keys.size();
    uint64_t hit = 0;
    for (int64_t k : keys) hit += (predicted_[static_cast<size_t>(k)] & 1) != 0;
    r.predicted_hits += hit;
    const double sample =
        keys.empty() ? 0.0 : static_cast<double>(hit) / static_cast<double>(keys.size());
    r.ema = r.samples == 0 ? sample : 0.8 * r.ema + 0.2 * sample;
    r.samples++;
    r.gated = r.samples >= static_cast<uint64_t>(opt_.gate_warmup) && r.ema < opt_.gate_threshold;
    for (int e = 0; e < dir_.num_experts(); ++e)
      predicted_[static_cast<size_t>(key_of(layer, e))] &= ~1;
  }
  std::vector<char> wanted_flag(static_cast<size_t>(dir_.num_experts()), 0);
  for (int e : experts) wanted_flag[static_cast<size_t>(e)] = 1;
  for (auto it = prefetch_q_.begin(); it != prefetch_q_.end();) {
    const int jl = static_cast<int>(it->key / dir_.num_experts());
    const int je = static_cast<int>(it->key % dir_.num_experts());
    if (jl < layer || (jl == layer && !wanted_flag[static_cast<size_t>(je)])) {
      Slot& s = slots_[static_cast<size_t>(it->slot)];
      if (s.key == it->key && s.state == SlotState::kLoading && s.pins == 0) {
        where_.erase(s.key);
        s.key = -1;
        s.state = SlotState::kEmpty;
        s.prefetched = false;
      }
      it = prefetch_q_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& s : slots_) {
    if (s.prefetched && s.key >= 0 && s.key / dir_.num_experts() == layer &&
        !wanted_flag[static_cast<size_t>(s.key % dir_.num_experts())]) {
      s.last_use = 0;  // demoted: evicted first (its bytes count as wasted then)
    }
  }
  // Hits pin their slot; misses get a slot and a read, issued in file-offset order.
  std::vector<int> slot(keys.size(), -1);
  std::vector<size_t> misses;
  for (size_t i = 0; i < keys.size(); ++i) {
    heat_[static_cast<size_t>(keys[i])]++;
    stats_.requests++;
    auto it = where_.find(keys[i]);
    if (it != where_.end()) {
      Slot& s = slots_[static_cast<size_t>(it->second)];
      slot[i] = it->second;
      s.pins++;
      if (s.prefetched) {
        s.prefetched = false;
        stats_.prefetch_used++;
        if (s.state == SlotState::kLoading) {  // promote a queued prediction to demand priority
          for (auto q = prefetch_q_.begin(); q != prefetch_q_.end(); ++q) {
            if (q->slot == it->second) {
              demand_q_.push_back({q->slot, q->key, false});
              prefetch_q_.erase(q);
              work_cv_.notify_one();
              break;
            }
          }
        }
      }
      stats_.hits++;
      key_hits_[static_cast<size_t>(keys[i])]++;
      stats_.bytes_served +=
          dir_.location(layer, static_cast<int>(keys[i] % dir_.num_experts())).bytes;
    } else {
      misses.push_back(i);
    }
  }
  std::sort(misses.begin(), misses.end(), [&](size_t a, size_t b) {
    const ExpertLocation& la = dir_.location(layer, static_cast<int>(keys[a] % dir_.num_experts()));
    const ExpertLocation& lb = dir_.location(layer, static_cast<int>(keys[b] % dir_.num_experts()));
    return std::make_pair(la.ranges[0].shard, la.ranges[0].offset) <
           std::make_pair(lb.ranges[0].shard, lb.ranges[0].offset);
  });
  for (size_t i : misses) {
    stats_.bytes_served +=
        dir_.location(layer, static_cast<int>(keys[i] % dir_.num_experts())).bytes;
    int sl = take_slot_locked(keys[i], false);
    if (sl < 0) continue;  // scheduled by the batch once compute frees a slot
    slots_[static_cast<size_t>(sl)].pins++;
    start_read_locked(sl, keys[i], false);
    slot[i] = sl;
  }
  return std::make_unique<Batch>(*this, std::move(keys), std::move(slot));
}

ExpertHandle ExpertStore::acquire(int layer, int expert) {
  const int e[1] = {expert};
  auto b = request(layer, e);
  size_t idx;
  ExpertHandle h;
  b->next(idx, h);
  return h;
}

void ExpertStore::prefetch(int layer, std::span<const int> experts) {
  std::lock_guard<std::mutex> l(mu_);
  if (layer < dir_.first_moe_layer() || layer >= dir_.num_layers()) return;
  const bool read = !recall_[static_cast<size_t>(layer)].gated;
  for (int e : experts) {
    if (e < 0 || e >= dir_.num_experts()) continue;
    const int64_t k = key_of(layer, e);
    predicted_[static_cast<size_t>(k)] |= 1;  // scored even when the gate keeps it from being read
    if (!read || where_.count(k)) continue;
    int sl = take_slot_locked(k, true);
    if (sl < 0) continue;
    start_read_locked(sl, k, true);
  }
}

ExpertStats ExpertStore::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

ExpertHeat ExpertStore::heat() const {
  std::lock_guard<std::mutex> l(mu_);
  return {dir_.num_layers(), dir_.num_experts(), key_hits_, key_misses_};
}

std::vector<LayerRecall> ExpertStore::recall() const {
  std::lock_guard<std::mutex> l(mu_);
  return recall_;
}

std::string ExpertStore::describe() const {
  return fmt::format(
      "store: {} slots of {:.1f} MiB ({:.2f} GiB), {} readers, {}, policy {}", slots_.size(),
      slot_bytes_ / 1048576.0, static_cast<double>(slots_.size() * slot_bytes_) / 1073741824.0,
      readers_.size(), direct_ok_ ? "O_DIRECT" : "buffered reads", cache_policy_name(opt_.policy));
}

void ExpertStore::save_heat() const {
  if (opt_.heat_file.empty()) return;
  std::string out("DFHEAT1\0", 8);
  uint64_t dims[2] = {static_cast<uint64_t>(dir_.num_layers()),
                      static_cast<uint64_t>(dir_.num_experts())};
  out.append(reinterpret_cast<const char*>(dims), 16);
  {
    std::lock_guard<std::mutex> l(mu_);
    out.append(reinterpret_cast<const char*>(heat_.data()), heat_.size() * 8);
  }
  write_file_atomic(opt_.heat_file, out);
}

}  // namespace deltafin
