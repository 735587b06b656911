// The expert store: routed experts streamed from the checkpoint's shards into a RAM cache of
// whole experts under a byte budget (issue: run models far larger than RAM).
//
// Why it is built this way:
//  * One read per expert. The six tensors of an expert lie back to back in the release (and in
//    make-model output), so a miss is one aligned pread of ~17.5 MB; an expert whose tensors are
//    scattered still works, with one read per range.
//  * O_DIRECT where the platform has it, into page-aligned slot buffers: the cache is the only
//    copy in RAM, so the budget is honest and the page cache does not double-count (or hide
//    reads from a benchmark). Reads are widened to the 4 KiB grid and the expert is a view into
//    the middle of its slot.
//  * Reads of one pass are issued together, sorted by (shard, offset), to a pool of reader
//    threads; the batch hands experts to compute in arrival order, so compute on arrived
//    experts overlaps the remaining reads. A pass needing more experts than the cache holds
//    still works: slots are recycled as compute releases them.
//  * Prefetch hints (the next layer's predicted experts) are read in the background at lower
//    priority than demand reads; when the real router asks for a layer, queued predictions that
//    it did not choose are cancelled and arrived ones are demoted to be evicted first. Nothing
//    ever waits on a prediction it did not ask for.
//  * Eviction policy: LRU by default; LFU; or `pinned`, which keeps the hottest experts of a
//    persisted heat file resident and runs LRU on the rest.
//  * Faults (short read, truncated or replaced file) fail the request that needed the expert
//    with an IoError naming the shard; the store stays usable for everything else.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "experts/provider.h"

namespace deltafin {

enum class CachePolicy { kLRU, kLFU, kPinned };
CachePolicy parse_cache_policy(const std::string& s);
const char* cache_policy_name(CachePolicy p);

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
};

struct LayerRecall {
  uint64_t predicted_hits = 0;  // requested experts that had been predicted
  uint64_t requested = 0;       // requested experts in layers that had a prediction
  double ema = 0;               // recent recall (exponential moving average over passes)
  uint64_t samples = 0;
  bool gated = false;  // predictions too poor to be worth their reads right now
};

class ExpertStore : public ExpertProvider {
 public:
  ExpertStore(const ModelConfig& config, const Checkpoint& ck, ExpertFormat format,
              StoreOptions options);
  ~ExpertStore() override;

  ExpertLocation locate(int layer, int expert) const override;
  std::unique_ptr<ExpertBatch> request(int layer, std::span<const int> experts) override;
  ExpertHandle acquire(int layer, int expert) override;
  void prefetch(int layer, std::span<const int> experts) override;
  ExpertStats stats() const override;
  ExpertHeat heat() const override;
  std::string describe() const override;
  bool wants_prefetch() const override { return prefetch_enabled_; }
  void set_prefetch(bool on) { prefetch_enabled_ = on; }

  std::vector<LayerRecall> recall() const;
  size_t slots() const { return slots_.size(); }
  uint64_t slot_bytes() const { return slot_bytes_; }
  // Writes the heat counts (atomically) when a heat file was given.
  void save_heat() const;

  // The smallest cache that works: the experts one decode pass of one layer needs.
  static uint64_t min_cache_bytes(const ModelConfig& c, uint64_t expert_bytes);
  // RAM one cache slot takes for this checkpoint (the largest expert, widened to 4 KiB pages).
  static uint64_t slot_bytes_for(const ExpertDirectory& dir, const ModelConfig& c);

 private:
  class Batch;
  friend class Batch;
  enum class SlotState { kEmpty, kLoading, kReady, kError };
  struct Slot {
    uint8_t* buf = nullptr;
    int64_t key = -1;
    SlotState state = SlotState::kEmpty;
    int pins = 0;
    uint64_t last_use = 0;
    uint64_t freq = 0;
    bool prefetched = false;  // loaded on a hint and not yet asked for
    bool hot = false;         // pinned by the heat policy
    std::string error;
    std::shared_ptr<ExpertWeights> weights;
  };
  struct Job {
    int slot;
    int64_t key;
    bool prefetch;
  };

  int64_t key_of(int layer, int expert) const {
    return static_cast<int64_t>(layer) * dir_.num_experts() + expert;
  }
  // Finds a slot to (re)use for `key`; -1 if every slot is pinned. Caller holds mu_.
  int take_slot_locked(int64_t key, bool for_prefetch);
  void start_read_locked(int slot, int64_t key, bool prefetch);
  void reader_loop();
  void read_expert(Slot& slot, int64_t key);
  void unpin(int slot);
  ExpertHandle handle_locked(int slot);
  void check_files_locked();

  const Checkpoint& ck_;
  ExpertDirectory dir_;
  StoreOptions opt_;
  uint64_t slot_bytes_ = 0;
  std::vector<int> fds_;
  std::vector<std::string> paths_;
  bool direct_ok_ = true;
  bool prefetch_enabled_ = true;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // slot state changes
  std::condition_variable work_cv_;  // reader queue
  std::vector<Slot> slots_;
  std::unordered_map<int64_t, int> where_;
  std::deque<Job> demand_q_, prefetch_q_;
  std::vector<std::thread> readers_;
  bool stop_ = false;
  uint64_t tick_ = 0;
  std::vector<uint64_t> heat_;
  std::vector<uint64_t> key_hits_, key_misses_;  // this run's demand hits/misses per key
  std::vector<LayerRecall> recall_;
  std::vector<char> predicted_;  // per key: a prefetch hint was given since the layer's last pass
  double last_file_check_ = 0;
  mutable ExpertStats stats_;
};

}  // namespace deltafin
