#include "storage/expert_store.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <tuple>

#include "core/enum_names.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/timer.h"
#include "core/trace.h"
#include "core/weight_buffer.h"
#include "storage/checkpoint.h"

namespace deltafin {

constexpr EnumName<CachePolicy> kCachePolicyNames[] = {
    {CachePolicy::kLRU, "lru"},
    {CachePolicy::kLFU, "lfu"},
    {CachePolicy::kPinned, "pinned"},
};

CachePolicy parse_cache_policy(const std::string& s) {
  if (const auto p = value_of(kCachePolicyNames, s)) return *p;
  fail_setting("cache policy", s, "expected lru, lfu or pinned");
}

const char* cache_policy_name(CachePolicy p) {
  return name_of(kCachePolicyNames, p);
}

uint64_t ExpertStore::slot_bytes_for(const ExpertDirectory& dir, const ModelConfig& c) {
  uint64_t n = 0;
  for (int l = static_cast<int>(c.first_k_dense); l < c.num_layers; ++l) {
    for (int e = 0; e < c.moe.num_experts; ++e) n = std::max(n, dir.location(l, e).image_bytes);
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
      schedule_deferred_locked();
      for (size_t i = 0; i < keys_.size(); ++i) {
        if (taken_[i] || slot_[i] < 0) continue;
        Slot& sl = s_.slots_[static_cast<size_t>(slot_[i])];
        if (sl.state != SlotState::kReady && sl.state != SlotState::kError) continue;
        taken_[i] = true;
        ++n_taken_;
        if (n_taken_ == keys_.size()) {  // the drives owe this layer nothing more
          s_.last_done_at_ = now_seconds();
          s_.last_done_layer_ = s_.layer_of(keys_[i]);
        }
        s_.stats_.io_wait_s += waited;
        if (sl.state == SlotState::kError) throw_failed_locked(sl);
        index = i;
        handle = s_.handle_locked(slot_[i]);  // takes over this batch's pin
        return true;
      }
      Stopwatch sw;
      TraceSpan wait_span("read wait", "io", {{"layer", s_.layer_of(keys_.front())}});
      if (s_.sources_.count() > 1) {
        // With several drives a read that is late (a drive stalls) is hedged on another copy.
        s_.cv_.wait_for(l, std::chrono::milliseconds(10));
        s_.hedge_late_locked(keys_, slot_, taken_);
      } else {
        s_.cv_.wait(l);
      }
      waited += sw.elapsed();
    }
  }

 private:
  // Schedules what did not fit before (slots free up as compute releases experts).
  void schedule_deferred_locked() {
    for (size_t i = 0; i < keys_.size(); ++i) {
      if (taken_[i] || slot_[i] >= 0) continue;
      auto it = s_.where_.find(keys_[i]);
      if (it != s_.where_.end()) {
        slot_[i] = it->second;
        s_.slots_[static_cast<size_t>(it->second)].pins++;
        continue;
      }
      const int sl = s_.take_slot_locked(keys_[i], false);
      if (sl < 0) return;
      s_.slots_[static_cast<size_t>(sl)].pins++;
      s_.start_read_locked(sl, keys_[i], false);
      slot_[i] = sl;
    }
  }

  [[noreturn]] void throw_failed_locked(Slot& sl) {
    std::string msg = sl.error;
    sl.pins--;
    if (sl.pins == 0) {  // forget the failed expert so a later request retries it
      s_.where_.erase(sl.key);
      sl.key = -1;
      sl.state = SlotState::kEmpty;
    }
    throw IoError(msg);
  }

  ExpertStore& s_;
  std::vector<int64_t> keys_;
  std::vector<int> slot_;
  std::vector<bool> taken_;
  size_t n_taken_ = 0;
};

// ---------------------------------------------------------------------------------------------

ExpertStore::ExpertStore(const ModelConfig& c, const Checkpoint& ck, ExpertFormat format,
                         StoreOptions options)
    : dir_(c, ck, format),
      opt_(std::move(options)),
      sources_(dir_, ck, opt_.direct_io, opt_.readers, opt_.homes, opt_.min_read_piece,
               opt_.model_gate) {
  slot_bytes_ = slot_bytes_for(dir_, c);
  size_t n_slots = slot_bytes_ > 0 ? static_cast<size_t>(opt_.cache_bytes / slot_bytes_) : 0;
  if (opt_.cache_slots > 0) n_slots = opt_.cache_slots;
  const size_t need = static_cast<size_t>(c.moe.top_k);
  if (dir_.num_layers() > dir_.first_moe_layer() && n_slots < need) {
    fail_arg("expert cache of {} bytes holds {} experts; one pass of one layer needs {} ({} bytes)",
             opt_.cache_bytes, n_slots, need, need * slot_bytes_);
  }
  // With several drives one slot's bytes are kept for a hedged read's buffer (within the budget).
  if (sources_.count() > 1 && opt_.cache_slots == 0 && n_slots > need) n_slots -= kHedgeBuffers;
  slots_.resize(n_slots);
  const size_t n_keys =
      static_cast<size_t>(dir_.num_layers()) * static_cast<size_t>(dir_.num_experts());
  heat_.assign(n_keys, 0);
  key_hits_.assign(n_keys, 0);
  key_misses_.assign(n_keys, 0);
  predicted_.assign(n_keys, false);
  hot_.assign(n_keys, false);
  recall_.assign(static_cast<size_t>(dir_.num_layers()), {});
  idle_gap_.assign(static_cast<size_t>(dir_.num_layers()), -1.0);
  load_heat();
  if (opt_.policy == CachePolicy::kPinned) mark_hot_experts(n_slots);
}

ExpertStore::~ExpertStore() {
  sources_.stop();  // running reads land before the slots go
  try {
    save_heat();
  } catch (const std::exception& e) {
    log_warn("could not save expert heat statistics: {}", e.what());
  }
  for (uint8_t* b : buffers_) std::free(b);  // the slots' and the hedges', wherever they are now
}

// Heat statistics: counts per (layer, expert), persisted across runs.
std::vector<uint64_t> read_heat_file(const std::string& path, int layers, int experts) {
  std::vector<uint64_t> heat(static_cast<size_t>(layers) * static_cast<size_t>(experts), 0);
  if (path.empty()) return heat;
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  uint64_t dims[2] = {};
  if (in.read(magic, 8) && std::memcmp(magic, "DFHEAT1", 8) == 0 &&
      in.read(reinterpret_cast<char*>(dims), 16) && dims[0] == static_cast<uint64_t>(layers) &&
      dims[1] == static_cast<uint64_t>(experts)) {
    in.read(reinterpret_cast<char*>(heat.data()), static_cast<std::streamsize>(heat.size() * 8));
    if (!in) std::fill(heat.begin(), heat.end(), 0);
  }
  return heat;
}

void ExpertStore::load_heat() {
  heat_ = read_heat_file(opt_.heat_file, dir_.num_layers(), dir_.num_experts());
}

// The pinned policy: the hottest experts (by persisted heat) stay resident once loaded.
void ExpertStore::mark_hot_experts(size_t n_slots) {
  std::vector<size_t> order(heat_.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t n_hot =
      std::min(order.size(), static_cast<size_t>(opt_.pin_fraction * static_cast<double>(n_slots)));
  std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(n_hot), order.end(),
                    [&](size_t a, size_t b) { return heat_[a] > heat_[b]; });
  for (size_t i = 0; i < n_hot; ++i) {
    if (heat_[order[i]] > 0) hot_[order[i]] = true;
  }
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
    if (s.state == SlotState::kEmpty && s.key < 0 && !s.reading) {
      best = static_cast<int>(i);
      break;
    }
    if (s.pins > 0 || s.state == SlotState::kLoading || s.reading || s.hot) continue;
    if (for_prefetch && !s.prefetched && s.last_use + 1 >= tick_)
      continue;  // never evict this pass's experts for a guess
    if (best < 0 || better(s, slots_[static_cast<size_t>(best)])) best = static_cast<int>(i);
  }
  if (best < 0) return -1;
  Slot& v = slots_[static_cast<size_t>(best)];
  if (v.key >= 0) {
    if (v.prefetched) stats_.prefetch_wasted_bytes += location_of(v.key).bytes;
    where_.erase(v.key);
  }
  if (v.buf == nullptr) {
    v.buf = alloc_weight_buffer(slot_bytes_, "an expert slot");
    buffers_.push_back(v.buf);
  }
  v.gen++;
  v.key = key;
  v.state = SlotState::kEmpty;
  v.prefetched = false;
  v.hot = hot_[static_cast<size_t>(key)];
  v.error.clear();
  v.hedged = false;
  v.weights.reset();
  where_[key] = best;
  return best;
}

void ExpertStore::start_read_locked(int slot, int64_t key, bool prefetch) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  s.state = SlotState::kLoading;
  s.prefetched = prefetch;
  s.pieces = sources_.plan(layer_of(key), expert_of(key));
  s.piece_state.assign(s.pieces.size(), PieceState::kQueued);
  s.pieces_left = s.pieces.size();
  if (prefetch) {
    stats_.prefetch_issued++;
  } else {
    stats_.misses++;
    key_misses_[static_cast<size_t>(key)]++;
  }
  submit_read(slot, prefetch);
}

// Queues the slot's pieces that have not started (again, at demand priority, for a prediction
// the router chose while it was still queued: the first task to run a piece reads it).
void ExpertStore::submit_read(int slot, bool prefetch) {
  const Slot& s = slots_[static_cast<size_t>(slot)];
  for (size_t i = 0; i < s.pieces.size(); ++i) {
    if (s.piece_state[i] != PieceState::kQueued) continue;
    const ExpertSources::Piece& p = s.pieces[i];
    sources_.submit(p.source,
                    prefetch ? ReaderPool::Priority::kBackground : ReaderPool::Priority::kDemand,
                    p.end - p.begin, [this, slot, gen = s.gen, i] { run_piece(slot, gen, i); });
  }
}

void ExpertStore::release_if_idle_locked(uint8_t* buf) {
  auto it = writers_.find(buf);
  if (it != writers_.end() && it->second > 0) return;
  if (it != writers_.end()) writers_.erase(it);
  spare_.push_back(buf);
}

// A reader task. The slot may have been cancelled, reassigned, or its piece already read by a
// task submitted at higher priority since this one was queued: then there is nothing to do. The
// task that lands the last piece checks the expert (ExpertSources::finish) and hands it over.
void ExpertStore::run_piece(int slot, uint64_t gen, size_t piece) {
  std::unique_lock<std::mutex> l(mu_);
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (s.gen != gen || s.state != SlotState::kLoading || piece >= s.pieces.size() ||
      s.piece_state[piece] != PieceState::kQueued)
    return;
  s.piece_state[piece] = PieceState::kRunning;
  if (!s.reading) {
    s.reading = true;
    s.read_started = now_seconds();
  }
  const int64_t key = s.key;
  const int layer = layer_of(key), expert = expert_of(key);
  const ExpertSources::Piece p = s.pieces[piece];
  uint8_t* const buf = s.buf;
  writers_[buf]++;
  l.unlock();
  std::string err;
  int served = p.source;
  try {
    sources_.read_piece(p, layer, expert, buf, &served);
  } catch (const std::exception& e) {
    err = e.what();
  }
  l.lock();
  writers_[buf]--;
  if (s.buf != buf || s.gen != gen) {  // a hedged read finished first and took the slot
    release_if_idle_locked(buf);
    return;
  }
  s.piece_state[piece] = PieceState::kLanded;
  s.pieces[piece].source = served;  // where it came from (checked in finish)
  if (!err.empty() && s.error.empty()) s.error = err;
  if (--s.pieces_left > 0) return;
  std::shared_ptr<ExpertWeights> weights;
  if (s.error.empty()) {
    const std::vector<ExpertSources::Piece> landed = s.pieces;
    writers_[buf]++;  // the check may read pieces again into it
    l.unlock();
    try {
      weights = std::make_shared<ExpertWeights>(
          dir_.weights_from(sources_.finish(layer, expert, buf, landed)));
    } catch (const std::exception& e) {
      err = e.what();
    }
    l.lock();
    writers_[buf]--;
    if (s.buf != buf || s.gen != gen) {
      release_if_idle_locked(buf);
      return;
    }
    if (!err.empty()) s.error = err;
  }
  s.reading = false;
  if (s.error.empty()) {
    s.weights = std::move(weights);
    s.state = SlotState::kReady;
    stats_.bytes_read += location_of(key).bytes;
  } else {
    s.state = SlotState::kError;
  }
  cv_.notify_all();
}

// Reads still running well past what a read of that drive takes get a second read from another
// copy into a spare buffer; whichever lands first fills the slot (run_hedge swaps the buffers).
void ExpertStore::hedge_late_locked(const std::vector<int64_t>& keys, const std::vector<int>& slot,
                                    const std::vector<bool>& taken) {
  const double now = now_seconds();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (taken[i] || slot[i] < 0) continue;
    Slot& s = slots_[static_cast<size_t>(slot[i])];
    if (s.state != SlotState::kLoading || !s.reading || s.hedged) continue;
    // The late drive: the first with a piece not landed; the time a read there takes.
    int late = -1;
    double expect = 0;
    for (size_t k = 0; k < s.pieces.size(); ++k) {
      const uint64_t n = s.pieces[k].end - s.pieces[k].begin;
      expect = std::max(expect, sources_.read_seconds(s.pieces[k].source, n));
      if (late < 0 && s.piece_state[k] != PieceState::kLanded) late = s.pieces[k].source;
    }
    if (late < 0 || now - s.read_started < 2 * expect + 0.02) continue;
    const std::vector<ExpertSources::Piece> alt =
        sources_.plan(layer_of(keys[i]), expert_of(keys[i]), late);
    if (alt.empty()) continue;
    const int source = alt.front().source;
    if (spare_.empty()) {
      if (buffers_.size() >= slots_.size() + kHedgeBuffers) return;
      buffers_.push_back(alloc_weight_buffer(slot_bytes_, "a hedged read"));
      spare_.push_back(buffers_.back());
    }
    uint8_t* buf = spare_.back();
    spare_.pop_back();
    s.hedged = true;
    const int sl = slot[i];
    const int64_t key = keys[i];
    const uint64_t gen = s.gen;
    sources_.submit(source, ReaderPool::Priority::kDemand, location_of(key).image_bytes,
                    [this, sl, key, gen, source, buf] { run_hedge(sl, key, gen, source, buf); });
  }
}

void ExpertStore::run_hedge(int slot, int64_t key, uint64_t gen, int source, uint8_t* buf) {
  std::shared_ptr<ExpertWeights> weights;
  {
    std::lock_guard<std::mutex> l(mu_);
    const Slot& s = slots_[static_cast<size_t>(slot)];
    if (s.gen != gen || s.state != SlotState::kLoading) {  // the first read landed meanwhile
      spare_.push_back(buf);
      return;
    }
  }
  try {
    weights = std::make_shared<ExpertWeights>(
        dir_.weights_from(sources_.read_whole(source, layer_of(key), expert_of(key), buf)));
  } catch (const IoError& e) {
    sources_.mark_bad(source, e.what());
  }
  std::lock_guard<std::mutex> l(mu_);
  Slot& s = slots_[static_cast<size_t>(slot)];
  const bool won = weights && s.gen == gen && s.key == key && s.state == SlotState::kLoading;
  sources_.count_hedge(source, won);
  if (!won) {
    spare_.push_back(buf);
    return;
  }
  // The first read's pieces may still write into the old buffer: it becomes spare when the last
  // of them returns.
  uint8_t* const old = s.buf;
  s.buf = buf;
  s.reading = false;
  s.weights = std::move(weights);
  s.state = SlotState::kReady;
  stats_.bytes_read += location_of(key).bytes;
  release_if_idle_locked(old);
  cv_.notify_all();
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

std::unique_ptr<ExpertBatch> ExpertStore::request(int layer, std::span<const int> experts) {
  sources_.model_files().check_identity();
  std::lock_guard<std::mutex> l(mu_);
  ++tick_;
  std::vector<int64_t> keys;
  for (int e : experts) {
    dir_.location(layer, e);  // validates the id
    keys.push_back(key_of(layer, e));
  }
  if (score_prediction_locked(layer, keys)) measure_idle_gap_locked(layer);
  last_done_layer_ = -1;
  drop_unchosen_predictions_locked(layer, experts);
  std::vector<int> slot(keys.size(), -1);
  issue_misses_locked(pin_hits_locked(keys, slot), keys, slot);
  return std::make_unique<Batch>(*this, std::move(keys), std::move(slot));
}

// Recall of this layer's prediction (if it had one) and the gate that follows from it.
bool ExpertStore::score_prediction_locked(int layer, const std::vector<int64_t>& keys) {
  bool had_prediction = false;
  for (int e = 0; e < dir_.num_experts(); ++e)
    had_prediction = had_prediction || predicted_[static_cast<size_t>(key_of(layer, e))];
  if (!had_prediction) return false;
  LayerRecall& r = recall_[static_cast<size_t>(layer)];
  r.requested += keys.size();
  uint64_t hit = 0;
  for (int64_t k : keys) hit += predicted_[static_cast<size_t>(k)] ? 1 : 0;
  r.predicted_hits += hit;
  const double sample =
      keys.empty() ? 0.0 : static_cast<double>(hit) / static_cast<double>(keys.size());
  r.ema = r.samples == 0 ? sample : 0.8 * r.ema + 0.2 * sample;
  r.samples++;
  r.gated = r.samples >= static_cast<uint64_t>(opt_.gate_warmup) && r.ema < opt_.gate_threshold;
  for (int e = 0; e < dir_.num_experts(); ++e)
    predicted_[static_cast<size_t>(key_of(layer, e))] = false;
  return true;
}

// Only a request that follows the previous layer's in the same pass measures a gap (the
// prediction of this layer was made from that pass).
void ExpertStore::measure_idle_gap_locked(int layer) {
  if (last_done_layer_ != layer - 1 || last_done_at_ < 0) return;
  const double gap = std::max(0.0, now_seconds() - last_done_at_);
  double& g = idle_gap_[static_cast<size_t>(layer)];
  g = g < 0 ? gap : 0.7 * g + 0.3 * gap;
}

size_t ExpertStore::idle_window_experts_locked(int layer) const {
  const double gap = idle_gap_[static_cast<size_t>(layer)];
  if (gap <= 0 || opt_.idle_window_share <= 0 || dir_.expert_bytes() == 0) return 0;
  const double bytes = opt_.idle_window_share * gap * sources_.bandwidth();
  return static_cast<size_t>(bytes / static_cast<double>(dir_.expert_bytes()));
}

// Predictions the router did not choose: queued ones (and those of earlier layers) are
// cancelled, arrived ones of this layer are demoted to be evicted first.
void ExpertStore::drop_unchosen_predictions_locked(int layer, std::span<const int> experts) {
  std::vector<bool> wanted(static_cast<size_t>(dir_.num_experts()), false);
  for (int e : experts) wanted[static_cast<size_t>(e)] = true;
  for (auto& s : slots_) {
    if (!s.prefetched || s.key < 0) continue;
    const int sl = layer_of(s.key);
    const bool unchosen =
        sl < layer || (sl == layer && !wanted[static_cast<size_t>(expert_of(s.key))]);
    if (!unchosen) continue;
    if (s.state == SlotState::kLoading && !s.reading && s.pins == 0) {
      where_.erase(s.key);  // its queued task finds the slot changed and returns
      s.key = -1;
      s.state = SlotState::kEmpty;
      s.prefetched = false;
    } else if (sl == layer) {
      s.last_use = 0;  // demoted: evicted first (its bytes count as wasted then)
    }
  }
}

std::vector<size_t> ExpertStore::pin_hits_locked(const std::vector<int64_t>& keys,
                                                 std::vector<int>& slot) {
  std::vector<size_t> misses;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (count_heat_) heat_[static_cast<size_t>(keys[i])]++;
    stats_.requests++;
    stats_.bytes_served += location_of(keys[i]).bytes;
    auto it = where_.find(keys[i]);
    if (it == where_.end()) {
      misses.push_back(i);
      continue;
    }
    Slot& s = slots_[static_cast<size_t>(it->second)];
    slot[i] = it->second;
    s.pins++;
    stats_.hits++;
    key_hits_[static_cast<size_t>(keys[i])]++;
    if (s.prefetched) {
      s.prefetched = false;
      stats_.prefetch_used++;
      // A prediction still queued: read it at demand priority now.
      if (s.state == SlotState::kLoading && !s.reading) submit_read(it->second, false);
    }
  }
  trace_counter("expert cache", {{"hits", stats_.hits}, {"misses", stats_.misses}});
  return misses;
}

// Misses get a slot and a read, issued in file-offset order; those that find no free slot are
// scheduled by the batch once compute frees one.
void ExpertStore::issue_misses_locked(std::vector<size_t> misses, const std::vector<int64_t>& keys,
                                      std::vector<int>& slot) {
  // Experts with one copy first (their drive is decided), then those with several, each to the
  // drive that will be done soonest with what it has by then: the drives finish together.
  auto order = [&](size_t i) {
    const ByteRange& r = location_of(keys[i]).ranges[0];
    const bool flexible =
        sources_.count() > 1 && sources_.copies(layer_of(keys[i]), expert_of(keys[i])) > 1;
    return std::make_tuple(flexible, r.shard, r.offset);
  };
  std::sort(misses.begin(), misses.end(), [&](size_t a, size_t b) { return order(a) < order(b); });
  for (size_t i : misses) {
    const int sl = take_slot_locked(keys[i], false);
    if (sl < 0) continue;
    slots_[static_cast<size_t>(sl)].pins++;
    start_read_locked(sl, keys[i], false);
    slot[i] = sl;
  }
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
  // Shut gate: only what the drives read in the gap they would sit idle (hints come most
  // confident first).
  const size_t window = recall_[static_cast<size_t>(layer)].gated
                            ? idle_window_experts_locked(layer)
                            : std::numeric_limits<size_t>::max();
  size_t issued = 0;
  for (int e : experts) {
    if (e < 0 || e >= dir_.num_experts()) continue;
    const int64_t k = key_of(layer, e);
    predicted_[static_cast<size_t>(k)] = true;  // scored even when the gate keeps it from a read
    if (issued >= window || where_.count(k)) continue;
    ++issued;
    const int sl = take_slot_locked(k, true);
    if (sl < 0) continue;
    start_read_locked(sl, k, true);
  }
}

ExpertHeat ExpertStore::heat() const {
  std::lock_guard<std::mutex> l(mu_);
  return {dir_.num_layers(), dir_.num_experts(), key_hits_, key_misses_};
}

ExpertStats ExpertStore::stats() const {
  ExpertStats s;
  {
    std::lock_guard<std::mutex> l(mu_);
    s = stats_;
  }
  s.read_s = sources_.busy_seconds();
  if (sources_.count() > 1) s.sources = sources_.stats();
  return s;
}

std::vector<LayerRecall> ExpertStore::recall() const {
  std::lock_guard<std::mutex> l(mu_);
  return recall_;
}

std::string ExpertStore::describe() const {
  // Tiny test models have experts of a few KiB: MiB would print them as "0.0 MiB".
  const double b = static_cast<double>(slot_bytes_);
  const std::string slot = b >= 1048576.0 ? fmt::format("{:.1f} MiB", b / 1048576.0)
                                          : fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("store: {} slot{} of {} ({:.2f} GiB), {} readers{}, {}, policy {}{}",
                     slots_.size(), slots_.size() == 1 ? "" : "s", slot,
                     static_cast<double>(slots_.size() * slot_bytes_) / 1073741824.0,
                     std::max(1, opt_.readers), sources_.count() > 1 ? " per drive" : "",
                     sources_.direct() ? "O_DIRECT" : "buffered reads",
                     cache_policy_name(opt_.policy), sources_.describe());
}

void ExpertStore::count_heat(bool on) {
  std::lock_guard<std::mutex> l(mu_);
  count_heat_ = on;
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
