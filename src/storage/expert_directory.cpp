#include "storage/expert_directory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/file_io.h"
#include "model/inventory.h"
#include "storage/checkpoint.h"
#include "storage/shard_files.h"

namespace deltafin {

bool ExpertLocation::contiguous() const {
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].shard != ranges[0].shard ||
        ranges[i].offset != ranges[i - 1].offset + ranges[i - 1].size) {
      return false;
    }
  }
  return !ranges.empty();
}

ByteRange ExpertLocation::span() const {
  return {ranges.front().shard, ranges.front().offset, bytes};
}

std::vector<const uint8_t*> ExpertLocation::tensors_in(const uint8_t* image) const {
  std::vector<const uint8_t*> out;
  out.reserve(tensor_pos.size());
  for (uint64_t p : tensor_pos) out.push_back(image + p);
  return out;
}

void read_image(const ShardFiles& files, const ExpertLocation& loc, uint64_t begin, uint64_t end,
                uint8_t* image, const std::string& what) {
  for (const auto& g : loc.image) {
    const uint64_t lo = std::max(begin, g.pos), hi = std::min(end, g.pos + g.size);
    if (lo >= hi) continue;
    const uint64_t need = std::min(hi, std::max(lo, g.pos + g.need)) - lo;
    std::memset(image + lo + need, 0, hi - lo - need);  // (what lies past the end of the file)
    files.read_aligned(g.shard, g.file_offset + (lo - g.pos), hi - lo, image + lo, need, what);
  }
}

namespace {
// Lays out the image of `loc` (its ranges already resolved).
void lay_out_image(ExpertLocation& loc) {
  auto add = [&](int shard, uint64_t offset, uint64_t size) {
    const uint64_t a0 = io_align_down(offset), a1 = io_align_up(offset + size);
    loc.image.push_back({shard, a0, a1 - a0, loc.image_bytes, offset + size - a0});
    loc.image_bytes += a1 - a0;
    return loc.image.back().pos + (offset - a0);
  };
  if (loc.contiguous()) {
    const ByteRange s = loc.span();
    uint64_t at = add(s.shard, s.offset, s.size);
    for (const auto& r : loc.ranges) {
      loc.tensor_pos.push_back(at);
      at += r.size;
    }
  } else {
    for (const auto& r : loc.ranges) loc.tensor_pos.push_back(add(r.shard, r.offset, r.size));
  }
}
}  // namespace

ExpertDirectory::ExpertDirectory(const ModelConfig& c, const Checkpoint& ck, ExpertFormat format)
    : format_(format),
      intermediate_(c.moe.intermediate),
      latent_(c.expert_dim()),
      first_moe_(static_cast<int>(c.first_k_dense)),
      num_layers_(static_cast<int>(c.num_layers)),
      num_experts_(static_cast<int>(c.moe.num_experts)) {
  specs_ = expert_tensors(c, format);
  std::vector<std::string> suffixes;
  for (const auto& t : specs_) suffixes.push_back(t.suffix);
  locations_.resize(static_cast<size_t>((num_layers_ - first_moe_) * num_experts_));
  for (int l = first_moe_; l < num_layers_; ++l) {
    for (int e = 0; e < num_experts_; ++e) {
      ExpertLocation& loc = locations_[static_cast<size_t>((l - first_moe_) * num_experts_ + e)];
      const std::string prefix = expert_prefix(c, l, e);
      // Order ranges by file offset within the tensor order so a contiguous expert is detected
      // whatever order its tensors were written in; keep tensor order for weights_from().
      for (const auto& s : suffixes) {
        const TensorInfo& t = ck.get(prefix + s);
        loc.ranges.push_back({t.shard, t.offset, t.nbytes});
        loc.bytes += t.nbytes;
      }
      lay_out_image(loc);
    }
  }
  if (!locations_.empty()) expert_bytes_ = locations_.front().bytes;
}

const ExpertLocation& ExpertDirectory::location(int layer, int expert) const {
  if (layer < first_moe_ || layer >= num_layers_ || expert < 0 || expert >= num_experts_) {
    fail("no routed expert {} in layer {} (MoE layers {}..{}, {} experts)", expert, layer,
         first_moe_, num_layers_ - 1, num_experts_);
  }
  return locations_[static_cast<size_t>((layer - first_moe_) * num_experts_ + expert)];
}

ExpertWeights ExpertDirectory::weights_from(const std::vector<const uint8_t*>& b) const {
  ExpertWeights w;
  const int64_t I = intermediate_, Hl = latent_;
  Matrix* m[3] = {&w.w1, &w.w2, &w.w3};  // gate [I, Hl], down [Hl, I], up [I, Hl]
  for (int k = 0; k < 3; ++k) {
    m[k]->rows = k == 1 ? Hl : I;
    m[k]->cols = k == 1 ? I : Hl;
  }
  for (size_t i = 0; i < specs_.size(); ++i) {
    Matrix& x = *m[specs_[i].matrix];
    switch (specs_[i].part) {
      case ExpertPart::kWeight:
        x.data = b[i];
        break;
      case ExpertPart::kScale:
        x.scales = b[i];
        break;
      case ExpertPart::kShape:
        break;
    }
  }
  for (Matrix* x : m) {
    switch (format_) {
      case ExpertFormat::kMXFP4:
        x->format = WeightFormat::kMXFP4;
        break;
      case ExpertFormat::kBF16:
        x->format = WeightFormat::kBF16;
        break;
      case ExpertFormat::kFP8:  // codes + F32 128x128 block scales
        x->format = WeightFormat::kFP8;
        break;
      case ExpertFormat::kInt4:  // packed words + BF16 group scales; the logical shape is [rows,
                                 // cols] above (the inventory holds weight_shape to it)
        x->format = WeightFormat::kInt4;
        break;
    }
  }
  return w;
}

namespace {
class ReadyBatch : public ExpertBatch {
 public:
  explicit ReadyBatch(std::vector<ExpertHandle> items) : items_(std::move(items)) {}
  bool next(size_t& index, ExpertHandle& handle) override {
    if (pos_ >= items_.size()) return false;
    index = pos_;
    handle = items_[pos_++];
    return true;
  }

 private:
  std::vector<ExpertHandle> items_;
  size_t pos_ = 0;
};
}  // namespace

MmapExpertProvider::MmapExpertProvider(const ModelConfig& c, const Checkpoint& ck,
                                       ExpertFormat format)
    : ck_(ck), dir_(c, ck, format) {
  const int n_layers = dir_.num_layers() - dir_.first_moe_layer();
  views_.resize(static_cast<size_t>(n_layers * dir_.num_experts()));
  for (int l = dir_.first_moe_layer(); l < dir_.num_layers(); ++l) {
    for (int e = 0; e < dir_.num_experts(); ++e) {
      const ExpertLocation& loc = dir_.location(l, e);
      std::vector<const uint8_t*> ptrs;
      for (const auto& r : loc.ranges) ptrs.push_back(ck_.shards()[r.shard].data() + r.offset);
      views_[static_cast<size_t>((l - dir_.first_moe_layer()) * dir_.num_experts() + e)] =
          std::make_shared<ExpertWeights>(dir_.weights_from(ptrs));
    }
  }
}

ExpertHandle MmapExpertProvider::acquire(int layer, int expert) {
  const ExpertLocation& loc = dir_.location(layer, expert);
  requests_.fetch_add(1, std::memory_order_relaxed);
  bytes_served_.fetch_add(loc.bytes, std::memory_order_relaxed);
  return views_[static_cast<size_t>((layer - dir_.first_moe_layer()) * dir_.num_experts() +
                                    expert)];
}

std::unique_ptr<ExpertBatch> MmapExpertProvider::request(int layer, std::span<const int> experts) {
  std::vector<ExpertHandle> items;
  items.reserve(experts.size());
  for (int e : experts) items.push_back(acquire(layer, e));
  return std::make_unique<ReadyBatch>(std::move(items));
}

ExpertStats MmapExpertProvider::stats() const {
  ExpertStats s;
  s.requests = requests_.load();
  s.hits = s.requests;  // everything is addressable; the page cache does any I/O
  s.bytes_served = bytes_served_.load();
  return s;
}

std::string MmapExpertProvider::describe() const {
  return fmt::format(
      "mmap ({} routed experts of {} bytes, {})",
      static_cast<int64_t>(dir_.num_experts()) * (dir_.num_layers() - dir_.first_moe_layer()),
      dir_.expert_bytes(), expert_format_name(dir_.format()));
}

}  // namespace deltafin
