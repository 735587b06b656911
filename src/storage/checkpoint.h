// A checkpoint folder as released: model.safetensors, or model.safetensors.index.json naming
// shards (model-00001-of-000096.safetensors ...). Every shard is mapped read-only once and every
// tensor is a zero-copy view into its mapping. Headers are validated against the file (offsets
// inside the data region, sizes matching dtype x shape, no overlaps) with errors naming the file
// and the tensor, so a truncated or corrupt shard never crashes anything later.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "model/config.h"
#include "tensor/tensor_info.h"

namespace deltafin {

// The folder's config.json, parsed and validated (model/config.h: parse_config); throws Error
// naming the folder when it has none.
ModelConfig load_config(const std::string& model_dir);

class Checkpoint {
 public:
  // Opens `dir`; throws Error naming the file at fault.
  static std::unique_ptr<Checkpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::vector<MappedFile>& shards() const { return shards_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  // Throws Error if absent.
  const TensorInfo& get(const std::string& name) const;
  uint64_t total_bytes() const;

 private:
  void add_shard(const std::string& file_name);
  std::string dir_;
  std::vector<MappedFile> shards_;
  std::map<std::string, TensorInfo> tensors_;
};

// Limits on what a safetensors header may claim (SECURITY.md lists them).
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
inline constexpr size_t kMaxTensorsPerShard = 1'000'000;
inline constexpr size_t kMaxTensorNameBytes = 1024;
inline constexpr size_t kMaxTensorRank = 8;

// Parses one safetensors header (exposed for tests). `file` is used in messages.
std::vector<TensorInfo> parse_safetensors_header(const uint8_t* data, uint64_t size,
                                                 const std::string& file);
// The header's JSON alone (`header_len` bytes after the 8-byte length), for a data region of
// `data_size` bytes: offsets are from the file's start, `data` is left null. What checks a
// shard without mapping it uses (storage/checkpoint_check.h).
std::vector<TensorInfo> parse_safetensors_json(const uint8_t* header_bytes, uint64_t header_len,
                                               uint64_t data_size, const std::string& file);

}  // namespace deltafin
