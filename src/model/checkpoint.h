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
#include "tensor/dtype.h"

namespace deltafin {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int shard = 0;        // index into Checkpoint::shards()
  uint64_t offset = 0;  // absolute byte offset in the shard file
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the shard's mapping

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  std::string shape_string() const;
};

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

// Parses one safetensors header (exposed for tests). `file` is used in messages.
std::vector<TensorInfo> parse_safetensors_header(const uint8_t* data, uint64_t size,
                                                 const std::string& file);

std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace deltafin
