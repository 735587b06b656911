// The expert store: routed experts streamed from the checkpoint's shards into a RAM cache of
// whole experts under a byte budget, so a model far larger than RAM runs.
//
// Why it is built this way:
//  * One read per expert (per drive). The six tensors of an expert lie back to back in the
//    release (and in make-model output), so a miss is one aligned read of ~17.5 MB (O_DIRECT
//    into page-aligned slots: the cache is the only copy in RAM, so the budget is honest); an
//    expert whose tensors are scattered still works, with one read per range.
//  * Reads of one pass are issued together, sorted by (shard, offset), to a ReaderPool; the
//    batch hands experts to compute in arrival order, so compute on arrived experts overlaps the
//    remaining reads. A pass needing more experts than the cache holds still works: slots are
//    recycled as compute releases them.
//  * Prefetch hints (the next layer's predicted experts) are read at background priority; when
//    the real router asks for a layer, queued predictions it did not choose are cancelled (their
//    slot is freed; the queued task finds that and returns) and arrived ones are demoted to be
//    evicted first. A chosen prediction still queued is re-submitted at demand priority.
//  * Reading while computing: the drives are idle from the last expert of one layer's pass to
//    the next layer's request (the rest of the layer, the next one's attention). The store
//    measures that gap per layer and, even with the prediction gate shut, reads as many hints
//    (most confident first) as the drives finish in it: right ones come off the next layer's
//    critical path, wrong ones cost only idle drive time (they are evicted first).
//  * Eviction policy: LRU by default; LFU; or `pinned`, which keeps the hottest experts of a
//    persisted heat file resident and runs LRU on the rest.
//  * Faults (short read, truncated or replaced file) fail the request that needed the expert
//    with an IoError naming the shard; the store stays usable for everything else.
//  * Homes (--home): an expert with copies on other drives is read from all of them at once, in
//    pieces that finish together (one task per piece; the task landing the last one checks the
//    expert and hands it over); a pass's single-copy misses are issued first, so the drives
//    finish a layer together (storage/expert_sources.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "storage/expert_directory.h"
#include "storage/expert_sources.h"
#include "storage/expert_step.h"
#include "storage/reader_pool.h"

namespace deltafin {

enum class CachePolicy { kLRU, kLFU, kPinned };
CachePolicy parse_cache_policy(const std::string& s);
const char* cache_policy_name(CachePolicy p);

// The persisted heat counts of `path` (written by ExpertStore::save_heat), indexed
// [layer * experts + expert]; all zero when the file is missing, unreadable or of another shape.
std::vector<uint64_t> read_heat_file(const std::string& path, int layers, int experts);

struct StoreOptions {
  uint64_t cache_bytes = 0;  // RAM for cached experts (rounded down to whole slots)
  size_t cache_slots = 0;    // if > 0: exactly this many experts instead (tests)
  int readers = 4;
  bool direct_io = true;  // O_DIRECT when the file system allows it
  CachePolicy policy = CachePolicy::kLRU;
  std::string heat_file;      // persisted per-expert use counts ("" = none)
  double pin_fraction = 0.5;  // share of slots the pinned policy may hold with hot experts
  // Prefetch gate: after `gate_warmup` predictions of a layer, its hints are only read when the
  // layer's recent recall is at least `gate_threshold` (otherwise they are scored, not read).
  // On a saturated disk a wrong guess costs a whole expert read; a right one only moves a read
  // that had to happen anyway.
  double gate_threshold = 0.9;
  int gate_warmup = 4;
  // Behind a shut gate, the hints the drives can read in this share of the layer's measured idle
  // gap are still read (0 = none).
  double idle_window_share = 0.75;
  bool prefetch = true;  // act on prefetch hints at all
  // Homes on other drives holding copies of experts (storage/home.h, `deltafin place`): each
  // read goes to the copy that will finish first (storage/expert_sources.h).
  std::vector<std::string> homes;
  // The smallest piece an expert's read is split into when several drives hold it (storage/
  // expert_sources.h); at least 4 KiB.
  uint64_t min_read_piece = ExpertSources::kDefaultMinPiece;
  // Shared with a streaming trunk's readers (the same drive): their read-ahead waits for this
  // store's demand reads from the model folder (storage/reader_pool.h).
  std::shared_ptr<ReadGate> model_gate;
};

class ExpertStore : public ExpertProvider {
 public:
  ExpertStore(const ModelConfig& config, const Checkpoint& ck, ExpertFormat format,
              StoreOptions options);
  ~ExpertStore() override;

  ExpertLocation locate(int layer, int expert) const { return dir_.location(layer, expert); }
  uint64_t expert_bytes() const override { return dir_.expert_bytes(); }
  std::unique_ptr<ExpertBatch> request(int layer, std::span<const int> experts) override;
  void run(const ExpertStep& step) override { run_as_ready(*this, step); }
  ExpertHandle acquire(int layer, int expert) override;
  void prefetch(int layer, std::span<const int> experts) override;
  ExpertStats stats() const override;
  ExpertHeat heat() const override;
  std::string describe() const override;
  bool wants_prefetch() const override { return opt_.prefetch; }
  std::vector<LayerRecall> recall() const override;

  size_t slots() const { return slots_.size(); }
  uint64_t slot_bytes() const { return slot_bytes_; }
  // Writes the heat counts (atomically) when a heat file was given.
  void save_heat() const;
  // While off, requests are not counted into the persisted heat (a measurement that asks for
  // other experts than the model would, bench's in-RAM reference, must not bias `place`).
  void count_heat(bool on);

  // The smallest cache that works: the experts one decode pass of one layer needs.
  static uint64_t min_cache_bytes(const ModelConfig& c, uint64_t expert_bytes);
  // RAM one cache slot takes for this checkpoint (the largest expert, widened to 4 KiB pages).
  static uint64_t slot_bytes_for(const ExpertDirectory& dir, const ModelConfig& c);

 private:
  class Batch;
  friend class Batch;
  enum class SlotState { kEmpty, kLoading, kReady, kError };
  enum class PieceState : uint8_t { kQueued, kRunning, kLanded };
  struct Slot {
    uint8_t* buf = nullptr;
    int64_t key = -1;
    SlotState state = SlotState::kEmpty;
    bool reading = false;  // a reader task has started this slot's read
    // The read: pieces of the expert's image, each from one drive (ExpertSources::plan; once
    // landed, the drive that served it), and where each stands.
    std::vector<ExpertSources::Piece> pieces;
    std::vector<PieceState> piece_state;
    size_t pieces_left = 0;
    uint64_t gen = 0;  // bumped each time the slot takes an expert
    double read_started = 0;
    bool hedged = false;  // a second read was sent to another copy
    int pins = 0;
    uint64_t last_use = 0;
    uint64_t freq = 0;
    bool prefetched = false;  // loaded on a hint and not yet asked for
    bool hot = false;         // pinned by the heat policy
    std::string error;
    std::shared_ptr<ExpertWeights> weights;
  };

  // Experts are keyed layer * num_experts + expert; these are the only places that know it.
  int64_t key_of(int layer, int expert) const {
    return static_cast<int64_t>(layer) * dir_.num_experts() + expert;
  }
  int layer_of(int64_t key) const { return static_cast<int>(key / dir_.num_experts()); }
  int expert_of(int64_t key) const { return static_cast<int>(key % dir_.num_experts()); }
  const ExpertLocation& location_of(int64_t key) const {
    return dir_.location(layer_of(key), expert_of(key));
  }

  void load_heat();
  void mark_hot_experts(size_t n_slots);
  // The phases of request(), all under mu_. Returns whether the layer had a prediction.
  bool score_prediction_locked(int layer, const std::vector<int64_t>& keys);
  // The drives' idle gap before this request of `layer` (after the previous layer's last expert
  // was delivered), averaged per layer.
  void measure_idle_gap_locked(int layer);
  // How many hints of `layer` the drives can read in its idle gap.
  size_t idle_window_experts_locked(int layer) const;
  void drop_unchosen_predictions_locked(int layer, std::span<const int> experts);
  // Pins the cached ones (slot index) and returns the indices of the misses.
  std::vector<size_t> pin_hits_locked(const std::vector<int64_t>& keys, std::vector<int>& slot);
  void issue_misses_locked(std::vector<size_t> misses, const std::vector<int64_t>& keys,
                           std::vector<int>& slot);

  // Finds a slot to (re)use for `key`; -1 if every slot is pinned. Caller holds mu_.
  int take_slot_locked(int64_t key, bool for_prefetch);
  void start_read_locked(int slot, int64_t key, bool prefetch);
  void submit_read(int slot, bool prefetch);
  void run_piece(int slot, uint64_t gen, size_t piece);
  // Gives a buffer no slot owns back to the spares once no read writes into it any more.
  void release_if_idle_locked(uint8_t* buf);
  void hedge_late_locked(const std::vector<int64_t>& keys, const std::vector<int>& slot,
                         const std::vector<bool>& taken);
  void run_hedge(int slot, int64_t key, uint64_t gen, int source, uint8_t* buf);
  static constexpr size_t kHedgeBuffers = 1;
  void unpin(int slot);
  ExpertHandle handle_locked(int slot);

  ExpertDirectory dir_;
  StoreOptions opt_;
  uint64_t slot_bytes_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // slot state changes
  std::vector<Slot> slots_;
  std::vector<uint8_t*> buffers_;  // every slot and hedge buffer allocated (freed at the end)
  std::vector<uint8_t*> spare_;    // buffers no slot owns, for hedged reads
  std::unordered_map<uint8_t*, int> writers_;  // reads in flight into each buffer
  std::unordered_map<int64_t, int> where_;
  uint64_t tick_ = 0;
  std::vector<uint64_t> heat_;
  bool count_heat_ = true;
  std::vector<uint64_t> key_hits_, key_misses_;  // this run's demand hits/misses per key
  std::vector<LayerRecall> recall_;
  // The drives' idle gap per layer (seconds, moving average; < 0 = not measured yet), and when
  // and for which layer a batch last delivered its final expert.
  std::vector<double> idle_gap_;
  double last_done_at_ = -1;
  int last_done_layer_ = -1;
  std::vector<bool> predicted_;  // per key: a hint was given since the layer's last pass
  std::vector<bool> hot_;        // per key: the pinned policy keeps it resident
  mutable ExpertStats stats_;
  // The drives and their readers; stopped first in the destructor, before the slots they write
  // into go away.
  ExpertSources sources_;
};

}  // namespace deltafin
