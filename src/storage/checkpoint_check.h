// A checkpoint folder checked file by file without loading it (`deltafin doctor --model`): unlike
// Checkpoint::open, which stops at the first fault, this lists every one — each shard the index
// names present, its header parsed, its size what the header implies (8 + header + the end of
// its last tensor), the index's tensors where it says they are — and keeps the tensors it could
// read, so the inventory can still be checked against the config. `verify_checkpoint_bytes` then
// reads every byte of every shard (the reads go through the fault-injection seam like every
// other checkpoint read, so tests can make a region unreadable) and reports the regions that
// could not be read, with the tensors they hold.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/inventory.h"

namespace deltafin {

struct ShardCheck {
  std::string file;  // name in the folder
  bool present = false;
  uint64_t size = 0;           // on disk
  uint64_t expected_size = 0;  // 8 + header + data end, 0 when the header did not parse
  bool header_ok = false;
};

struct UnreadableRegion {
  std::string file;
  uint64_t offset = 0, length = 0;
  std::string error;
  std::vector<std::string> tensors;  // the tensors whose bytes lie in it (first few)
};

struct CheckpointCheck {
  std::string dir;
  std::vector<ShardCheck> shards;
  TensorTable tensors;                // from every header that parsed (shard = index in shards)
  std::vector<std::string> problems;  // one line each, naming the file
  // Filled by verify_checkpoint_bytes:
  bool verified = false;
  uint64_t bytes_verified = 0;
  double verify_seconds = 0;
  std::vector<UnreadableRegion> unreadable;
  bool ok() const { return problems.empty() && unreadable.empty(); }
};

// Checks the folder's index (or its single model.safetensors) and every shard's header and size.
// Never throws for what it finds (it reports it); throws only if `dir` is not a folder.
CheckpointCheck check_checkpoint_files(const std::string& dir);

// Reads every byte of every present shard in `chunk`-byte reads; a read that fails is retried
// once and then reported as an unreadable region (adjacent ones merged). `on_bytes(shard, offset,
// data, n)` sees every byte read, in order per shard (doctor hashes them); `progress(done, total)`
// is called after each chunk.
void verify_checkpoint_bytes(
    CheckpointCheck& check, uint64_t chunk = 8ull << 20,
    const std::function<void(size_t, uint64_t, const uint8_t*, size_t)>& on_bytes = {},
    const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace deltafin
