#include "storage/trunk_units.h"

#include "core/error.h"
#include "storage/checkpoint.h"

namespace deltafin {

std::vector<std::string> layer_trunk_tensors(const ModelConfig& c, int layer,
                                             const Checkpoint& ck) {
  return layer_trunk_tensors(c, layer, ck.tensors());
}

std::vector<std::string> layer_trunk_tensors(const ModelConfig& c, int layer,
                                             const TensorTable& all) {
  std::vector<std::string> names;
  const std::string P = c.names.layer(layer);
  const std::string E = c.names.moe(layer) + "experts.";
  for (auto it = all.lower_bound(P); it != all.end() && it->first.rfind(P, 0) == 0; ++it) {
    if (it->first.rfind(E, 0) != 0) names.push_back(it->first);
  }
  return names;
}

uint64_t layer_trunk_bytes(const ModelConfig& c, int layer, const Checkpoint& ck) {
  uint64_t n = 0;
  for (const auto& name : layer_trunk_tensors(c, layer, ck)) n += ck.get(name).nbytes;
  return n;
}

TensorLookup checkpoint_lookup(const Checkpoint& ck) {
  return [&ck](const std::string& name) -> std::pair<const TensorInfo*, const uint8_t*> {
    const TensorInfo& t = ck.get(name);
    return {&t, t.data};
  };
}

void ResidentTrunk::embed(std::span<const int32_t> tokens, float* out) {
  for (size_t r = 0; r < tokens.size(); ++r) {
    const Matrix row = embed_.row_slice(tokens[r], tokens[r] + 1);
    for (int64_t i = 0; i < hidden_; ++i)
      out[static_cast<int64_t>(r) * hidden_ + i] = matrix_element(row, 0, i);
  }
}

ResidentTrunk::ResidentTrunk(const ModelConfig& c, const Checkpoint& ck) {
  auto lookup = checkpoint_lookup(ck);
  auto [t, b] = lookup(c.names.embed());
  embed_ = weight_matrix(*t, b);
  hidden_ = c.hidden;
  head_ = bind_head(c, lookup);
  for (int i = 0; i < c.num_layers; ++i) layers_.push_back(bind_layer(c, i, lookup));
}

uint64_t trunk_bytes_per_pass(const ModelConfig& c, const Checkpoint& ck) {
  uint64_t n = 0;
  for (int i = 0; i < c.num_layers; ++i) n += layer_trunk_bytes(c, i, ck);
  n += static_cast<uint64_t>(c.vocab * c.hidden * 2);  // lm_head
  n += static_cast<uint64_t>(c.hidden * 2);            // one embedding row
  return n;
}

InventoryReport check_inventory(const ModelConfig& c, const Checkpoint& ck) {
  return check_inventory(c, ck.tensors(), ck.dir());
}

}  // namespace deltafin
