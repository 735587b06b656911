// The vision encoder (vision_encoder.h): opening checks everything before any image is seen —
// vision_config, media_proc_cfg, that the two agree on the patch and merge sizes, every vision
// tensor's name, shape and dtype — and then each image is decode → preprocess → tower.
#include "engine/vision_encoder.h"

#include <filesystem>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/timer.h"
#include "storage/trunk_units.h"

namespace deltafin {

namespace fs = std::filesystem;

VisionEncoder::VisionEncoder(std::shared_ptr<const Checkpoint> ck, VisionConfig config,
                             vision::MediaProcConfig media, ThreadPool* pool,
                             vision::ImageLimits limits)
    : checkpoint_(std::move(ck)), media_(media), pool_(pool), limits_(limits) {
  check_vision_inventory(config, checkpoint_->tensors(), checkpoint_->dir());
  VisionWeights w = bind_vision(config, checkpoint_lookup(*checkpoint_));
  tower_ = std::make_unique<VisionTower>(std::move(config), std::move(w));
}

std::unique_ptr<VisionEncoder> VisionEncoder::open(std::shared_ptr<const Checkpoint> ck,
                                                   ThreadPool* pool,
                                                   const vision::ImageLimits& limits) {
  const fs::path dir(ck->dir());
  const fs::path cfg_path = dir / "config.json";
  if (!fs::exists(cfg_path)) {
    fail("{}: no config.json (expected a Kimi K3 checkpoint folder with a vision_config)",
         ck->dir());
  }
  // No tower first: a text-only checkpoint may carry a placeholder vision_config (the released
  // text-only conversions do), which says nothing about a tower that is not there.
  bool any = false;
  for (const auto& [name, t] : ck->tensors()) any |= is_vision_tensor(name);
  if (!any) {
    fail_arg(
        "{}: the checkpoint holds no vision tower (no vision_tower.* / mm_projector.* tensors): "
        "it cannot embed images",
        ck->dir());
  }
  VisionConfig v =
      parse_vision_config_text(read_regular_file(cfg_path.string()), cfg_path.string());
  const fs::path pre_path = dir / "preprocessor_config.json";
  if (!fs::exists(pre_path)) {
    fail("{}: no preprocessor_config.json (expected the image processor's media_proc_cfg)",
         ck->dir());
  }
  vision::MediaProcConfig media =
      vision::parse_media_proc_config(read_regular_file(pre_path.string()), pre_path.string());
  if (media.patch_size != v.patch || media.merge_kernel_size != v.merge_h ||
      media.merge_kernel_size != v.merge_w) {
    fail(
        "{}: media_proc_cfg patch_size {} and merge_kernel_size {} disagree with vision_config "
        "patch_size {} and merge_kernel_size [{}, {}]",
        pre_path.string(), media.patch_size, media.merge_kernel_size, v.patch, v.merge_h,
        v.merge_w);
  }
  return std::make_unique<VisionEncoder>(std::move(ck), std::move(v), media, pool, limits);
}

std::unique_ptr<VisionEncoder> VisionEncoder::open(const std::string& dir, ThreadPool* pool,
                                                   const vision::ImageLimits& limits) {
  std::shared_ptr<const Checkpoint> ck = Checkpoint::open(dir);
  return open(std::move(ck), pool, limits);
}

vision::ImagePlan VisionEncoder::plan(std::span<const uint8_t> bytes, const std::string& name,
                                      vision::ImageInfo* info) const {
  const vision::ImageInfo i = vision::probe_image(bytes, name, limits_);
  if (info != nullptr) *info = i;
  try {
    return vision::plan_image(i.width, i.height, media_);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(name + ": " + e.what());
  }
}

ImageEmbedding VisionEncoder::encode(std::span<const uint8_t> bytes,
                                     const std::string& name) const {
  ImageEmbedding out;
  Stopwatch sw;
  const vision::Image im = vision::decode_image(bytes, name, limits_);
  out.info.width = im.width;
  out.info.height = im.height;
  out.info.mode = im.mode;
  out.info.format = vision::sniff_format(bytes, name);
  vision::PreprocessedImage pre;
  try {
    pre = vision::preprocess(im, media_);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(name + ": " + e.what());
  }
  out.plan = pre.plan;
  out.preprocess_seconds = sw.elapsed();
  out.rows = encode_pixels(pre.pixels);
  out.tower_seconds = sw.elapsed() - out.preprocess_seconds;
  out.hidden = config().text_hidden;
  out.tokens = static_cast<int64_t>(out.rows.size()) / out.hidden;
  if (out.tokens != out.plan.num_tokens) {
    fail("{}: the tower gave {} rows, the plan expected {}", name, out.tokens, out.plan.num_tokens);
  }
  return out;
}

std::vector<float> VisionEncoder::encode_pixels(const vision::PixelTensor& pixels,
                                                const VisionTap& tap) const {
  if (pixels.patch != config().patch ||
      static_cast<int64_t>(pixels.values.size()) != pixels.rows() * pixels.row_size()) {
    fail_arg("pixel tensor of {} values for {} patches of {}x{} (patch size {} expected)",
             pixels.values.size(), pixels.rows(), pixels.patch, pixels.patch, config().patch);
  }
  const VisionGrid g{pixels.frames, pixels.grid_h, pixels.grid_w};
  ThreadPool& pool = pool_ != nullptr ? *pool_ : global_pool();
  return tower_->forward(pixels.values.data(), g, pool, tap);
}

}  // namespace deltafin
