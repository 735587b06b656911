// The trunk under a memory budget: the units the plan keeps resident are read once into owned
// RAM (not mmap: the budget is honest, and a shard truncated under us is a read error, not a
// SIGBUS); the others are streamed every pass through the plan's stream buffers (at least two)
// — while layer L computes, the next streamed units in pass order are read into the other
// buffers, as many as there are free ones, wrapping into the next pass (its first units are
// read while the head and sampling compute). Trunk reads are known long before they are needed,
// so they are read-ahead reads (ReaderPool::Priority::kAhead): on the model folder's drive they
// yield to the expert store's demand reads (the router's experts, which a pass waits for) through
// a shared ReadGate; a unit is read at demand priority only when a pass asks for one that is not
// on its way. A pass that leaves the expected order (an error mid-pass) takes the buffer read
// furthest ahead. Reads go through ShardFiles (4 KiB grid, O_DIRECT where possible) in chunks
// served by a ReaderPool. Embedding rows are read on demand (one small buffered read per token).
// With --trunk int8 the resident units' BF16 matrices are quantised once at load; streamed
// units are used as read (BF16).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/weights.h"
#include "storage/plan.h"
#include "storage/reader_pool.h"
#include "storage/shard_files.h"

namespace deltafin {

class Checkpoint;
struct TensorInfo;

class StreamingTrunk : public TrunkProvider {
 public:
  // `gate`: shared with the expert store's pool for the model folder (reader_pool.h).
  StreamingTrunk(const ModelConfig& c, const Checkpoint& ck, const MemoryPlan& plan,
                 int readers = 4, bool direct_io = true, std::shared_ptr<ReadGate> gate = nullptr);
  ~StreamingTrunk() override;

  void embed(std::span<const int32_t> tokens, float* out) override;
  const LayerWeights& acquire(int layer) override;
  void release(int layer) override;
  const HeadWeights& acquire_head() override;
  void release_head() override;
  const RouterWeights* router(int layer) const override;
  TrunkStats stats() const override;
  std::string describe() const override;

 private:
  struct Span {
    int shard;
    uint64_t file_offset;  // aligned
    uint64_t length;       // aligned
    uint64_t buf_offset;
  };
  struct UnitLayout {
    std::vector<std::string> names;
    std::vector<const TensorInfo*> infos;
    std::vector<uint64_t> tensor_buf_offset;  // where each tensor's bytes start in the buffer
    std::vector<Span> spans;
    uint64_t buf_bytes = 0;
    uint64_t file_bytes = 0;
  };
  struct Completion {
    int pending = 0;
    std::string error;
  };
  struct Buffer {
    uint8_t* mem = nullptr;
    int unit = -1;        // -1: free
    bool bound = false;   // weights bound for this unit
    bool in_use = false;  // between acquire and release
    Completion done;
    LayerWeights layer;
    HeadWeights head;
  };

  UnitLayout layout_for(int unit) const;
  void read_resident_units();
  void read_routers();
  void make_stream_buffers();
  void bind_unit(int unit, const uint8_t* mem, LayerWeights* lw, HeadWeights* hw);
  void submit_locked(const UnitLayout& l, uint8_t* mem, Completion& done, int unit,
                     ReaderPool::Priority p);
  void start_locked(Buffer& b, int unit, ReaderPool::Priority p);
  int find_locked(int unit) const;  // the buffer holding (or reading) `unit`, or -1
  // A buffer for an unexpected unit: a free one, else the one read furthest ahead of `unit`
  // (waiting for its reads to land).
  int claim_locked(std::unique_lock<std::mutex>& l, int unit);
  void top_up_locked();               // read ahead into every free buffer
  int next_streamed(int unit) const;  // in pass order, wrapping
  int wait_unit(int unit);            // returns the buffer index

  const ModelConfig c_;  // a copy: the engine moves its config into the Model
  const Checkpoint& ck_;
  MemoryPlan plan_;
  ShardFiles files_;
  std::vector<UnitLayout> layouts_;
  // Resident units.
  std::vector<std::unique_ptr<uint8_t, void (*)(void*)>> resident_mem_;
  std::vector<LayerWeights> resident_layers_;
  HeadWeights resident_head_;
  std::vector<std::vector<uint8_t>> int8_store_;
  // Router roster for prediction: copies, so they survive int8 and streaming.
  std::vector<RouterWeights> routers_;
  std::vector<std::vector<uint8_t>> router_mem_;
  // Streaming.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Buffer>> buffers_;  // fixed once made: reads point into them
  int cursor_ = -1;                               // the last unit read ahead, in pass order
  TrunkStats stats_;
  const TensorInfo* embed_info_ = nullptr;
  ReaderPool pool_;  // last: its threads stop before anything they write into goes away
};

}  // namespace deltafin
