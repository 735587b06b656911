// What is known about one stored tensor: name, dtype, shape and where its bytes lie. The storage
// layer fills it from safetensors headers; the model binds weights from it without knowing
// which file (or buffer) the bytes came from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace deltafin {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int shard = 0;        // index into the checkpoint's shards
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

std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace deltafin
