// Where each routed expert's bytes lie in the checkpoint, and the provider that points straight
// into the mapped shards. `ExpertDirectory` resolves every expert's tensor ranges once (they are
// contiguous in the release, so one read fetches an expert) and builds weight views from
// pointers to those bytes; the store (expert_store.h) and the mmap provider share it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/experts.h"
#include "model/inventory.h"
#include "storage/expert_step.h"

namespace deltafin {

class Checkpoint;
class ShardFiles;

struct ByteRange {
  int shard = 0;
  uint64_t offset = 0;  // absolute offset in the shard file
  uint64_t size = 0;
};

// One stretch of an expert's image (below): a 4 KiB-aligned span of a shard.
struct ImageSegment {
  int shard = 0;
  uint64_t file_offset = 0;  // on the 4 KiB grid
  uint64_t size = 0;         // a multiple of 4 KiB
  uint64_t pos = 0;          // where it begins in the image
  uint64_t need = 0;         // its bytes up to the last tensor byte (the rest may lie past EOF)
};

struct ExpertLocation {
  std::vector<ByteRange> ranges;  // one per tensor, in expert_tensors() order
  uint64_t bytes = 0;             // sum of range sizes
  // The expert as a cache slot holds it, whichever drive it came from: each tensor's range
  // widened to the 4 KiB grid (tensors back to back share one widened span), the spans one
  // after another. Homes store this image verbatim, so any 4 KiB-aligned piece of it read from
  // any copy lands where every other copy would put it, and one expert can be read from several
  // drives at once (storage/expert_sources.h).
  std::vector<ImageSegment> image;
  uint64_t image_bytes = 0;
  std::vector<uint64_t> tensor_pos;  // where each tensor begins in the image
  // True when the ranges are back to back in one shard (one read fetches the expert).
  bool contiguous() const;
  // The single range covering all tensors (only meaningful when contiguous()).
  ByteRange span() const;
  // Pointers to the tensors of an image held at `image`.
  std::vector<const uint8_t*> tensors_in(const uint8_t* image) const;
};

// Reads [begin, end) of an expert's image (4 KiB-aligned bounds) from the model folder's shards to
// `image + begin` (`image` 4 KiB aligned); the image's bytes past the end of its shard are zero,
// so an image reads the same from every copy. Throws IoError.
void read_image(const ShardFiles& files, const ExpertLocation& loc, uint64_t begin, uint64_t end,
                uint8_t* image, const std::string& what);

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
  std::vector<ExpertTensor> specs_;  // the tensors of one expert, in location order
  int64_t intermediate_, latent_;
  int first_moe_, num_layers_, num_experts_;
  uint64_t expert_bytes_ = 0;
  std::vector<ExpertLocation> locations_;  // [layer - first_moe][expert]
};

// Points into the mapped shards: no copies, no reads of its own (the page cache does the I/O).
class MmapExpertProvider : public ExpertProvider {
 public:
  MmapExpertProvider(const ModelConfig& config, const Checkpoint& ck, ExpertFormat format);
  ExpertLocation locate(int layer, int expert) const { return dir_.location(layer, expert); }
  uint64_t expert_bytes() const override { return dir_.expert_bytes(); }
  std::unique_ptr<ExpertBatch> request(int layer, std::span<const int> experts) override;
  void run(const ExpertStep& step) override { run_as_ready(*this, step); }
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
