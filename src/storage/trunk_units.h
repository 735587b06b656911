// The K3 view of a checkpoint on the storage side: which tensors make one trunk unit (a layer's
// weights but its routed experts), the inventory check against the config, lookups into the
// mapping, and the trunk bound straight to the mapped shards (--mmap: the page cache does all
// I/O, as llama.cpp runs a model larger than RAM).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/inventory.h"
#include "model/weights.h"

namespace deltafin {

class Checkpoint;

// The names of one layer's trunk tensors.
std::vector<std::string> layer_trunk_tensors(const ModelConfig& c, int layer, const Checkpoint& ck);
std::vector<std::string> layer_trunk_tensors(const ModelConfig& c, int layer,
                                             const TensorTable& tensors);
// Bytes of the layer's trunk tensors (what a pass over the layer reads).
uint64_t layer_trunk_bytes(const ModelConfig& c, int layer, const Checkpoint& ck);
// Weight bytes a decode step reads excluding routed experts: every layer's trunk, the LM head
// and one embedding row.
uint64_t trunk_bytes_per_pass(const ModelConfig& c, const Checkpoint& ck);
// Lookup over a mapped checkpoint.
TensorLookup checkpoint_lookup(const Checkpoint& ck);
// Checks the checkpoint's tensors against the config (model/inventory.h).
InventoryReport check_inventory(const ModelConfig& c, const Checkpoint& ck);

// Every layer bound once to the mapped checkpoint.
class ResidentTrunk : public TrunkProvider {
 public:
  ResidentTrunk(const ModelConfig& c, const Checkpoint& ck);
  void embed(std::span<const int32_t> tokens, float* out) override;
  const LayerWeights& acquire(int layer) override { return layers_[static_cast<size_t>(layer)]; }
  void release(int) override {}
  const HeadWeights& acquire_head() override { return head_; }
  void release_head() override {}
  std::string describe() const override { return "memory-mapped (page cache)"; }

 private:
  Matrix embed_;
  int64_t hidden_ = 0;
  HeadWeights head_;
  std::vector<LayerWeights> layers_;
};

}  // namespace deltafin
