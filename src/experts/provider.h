// How the model reaches routed experts. The model asks for the experts one pass of a layer needs
// and gets pinned views (ExpertHandle) as they become ready; it never knows where the bytes live.
// `locate` gives the byte ranges of one expert's tensors in the checkpoint (contiguous in the
// release, so one read fetches an expert). The first implementation (MmapExpertProvider) points
// into the mapped shards; the budgeted SSD-streaming store replaces it behind this interface.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "tensor/matrix.h"

namespace deltafin {

class Checkpoint;

struct ByteRange {
  int shard = 0;
  uint64_t offset = 0;  // absolute offset in the shard file
  uint64_t size = 0;
};

struct ExpertLocation {
  std::vector<ByteRange> ranges;  // one per tensor, in expert_tensor_suffixes() order
  uint64_t bytes = 0;             // sum of range sizes
  // True when the ranges are back to back in one shard (one read fetches the expert).
  bool contiguous() const;
  // The single range covering all tensors (only meaningful when contiguous()).
  ByteRange span() const;
};

// One routed expert's matrices: w1 = gate [I, Hl], w2 = down [Hl, I], w3 = up [I, Hl].
struct ExpertWeights {
  Matrix w1, w2, w3;
};

// A pinned view: the weights stay valid (and resident) while the handle lives.
using ExpertHandle = std::shared_ptr<const ExpertWeights>;

struct ExpertStats {
  uint64_t requests = 0;      // experts asked for by passes
  uint64_t hits = 0;          // served from RAM without a read
  uint64_t misses = 0;        // needed a read from storage
  uint64_t bytes_read = 0;    // bytes read from storage by the provider
  uint64_t bytes_served = 0;  // expert bytes handed to compute
  uint64_t prefetch_issued = 0;
  uint64_t prefetch_used = 0;  // prefetched experts that a pass then asked for
  uint64_t prefetch_wasted_bytes = 0;
  double io_wait_s = 0;  // time compute spent waiting for reads
  double read_s = 0;     // time reader threads spent reading
};

// Per (layer, expert) demand counters since start, for the server's engine view: index
// [layer * experts + expert] over all `layers` layers (dense layers stay zero). Empty when the
// provider does not count them.
struct ExpertHeat {
  int layers = 0, experts = 0;
  std::vector<uint64_t> hits, misses;
};

// Counters accumulated between two snapshots.
ExpertStats operator-(const ExpertStats& a, const ExpertStats& b);
ExpertStats& operator+=(ExpertStats& a, const ExpertStats& b);

// The experts of one pass of one layer, delivered as they become ready. Callers take every item.
class ExpertBatch {
 public:
  virtual ~ExpertBatch() = default;
  // Blocks until some not-yet-taken expert is ready; returns its index into the request list and
  // its handle. Throws IoError if its read failed. Returns false when all have been taken.
  virtual bool next(size_t& index, ExpertHandle& handle) = 0;
};

class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  virtual ExpertLocation locate(int layer, int expert) const = 0;
  // Starts whatever reads the listed experts need (all of them together) and returns them as
  // they arrive. `experts` are distinct ids of one layer.
  virtual std::unique_ptr<ExpertBatch> request(int layer, std::span<const int> experts) = 0;
  // One expert, blocking.
  virtual ExpertHandle acquire(int layer, int expert) = 0;
  // A hint that a pass of `layer` will likely want these experts soon; never waited on.
  virtual void prefetch(int layer, std::span<const int> experts) {
    (void)layer;
    (void)experts;
  }
  // Whether prefetch hints do anything (the model only predicts routing when they do).
  virtual bool wants_prefetch() const { return false; }
  virtual ExpertStats stats() const = 0;
  virtual ExpertHeat heat() const { return {}; }
  virtual std::string describe() const = 0;
};

// Resolves expert locations from a checkpoint (shared by every provider).
class ExpertDirectory {
 public:
  ExpertDirectory(const ModelConfig& config, const Checkpoint& ck, ExpertFormat format);
  const ExpertLocation& location(int layer, int expert) const;
  ExpertFormat format() const { return format_; }
  // Views for one expert given a pointer to each of its tensors' bytes (in suffix order).
  ExpertWeights weights_from(const std::vector<const uint8_t*>& tensor_bytes) const;
  uint64_t expert_bytes() const { return expert_bytes_; }
  int first_moe_layer() const { return first_moe_; }
  int num_layers() const { return num_layers_; }
  int num_experts() const { return num_experts_; }

 private:
  ExpertFormat format_;
  int64_t intermediate_, latent_;
  int first_moe_, num_layers_, num_experts_;
  uint64_t expert_bytes_ = 0;
  std::vector<ExpertLocation> locations_;  // [layer - first_moe][expert]
};

// Points into the mapped shards: no copies, no reads of its own (the page cache does the I/O).
class MmapExpertProvider : public ExpertProvider {
 public:
  MmapExpertProvider(const ModelConfig& config, const Checkpoint& ck, ExpertFormat format);
  ExpertLocation locate(int layer, int expert) const override;
  std::unique_ptr<ExpertBatch> request(int layer, std::span<const int> experts) override;
  ExpertHandle acquire(int layer, int expert) override;
  ExpertStats stats() const override;
  std::string describe() const override;

 private:
  const Checkpoint& ck_;
  ExpertDirectory dir_;
  std::vector<std::shared_ptr<ExpertWeights>> views_;  // [layer - first_moe][expert]
  mutable std::atomic<uint64_t> requests_{0}, bytes_served_{0};
};

}  // namespace deltafin
