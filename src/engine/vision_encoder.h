// Image bytes in, the text model's input embeddings out: the one entry point for K3's image
// input (docs/VISION.md). It joins the image layer (src/vision: decoding, the processor's exact
// preprocessing) to the tower and projector (src/model/vision_tower.h) over a checkpoint's
// vision tensors, and is what `deltafin embed-image` runs and what the server's image requests
// are to call.
//
// Two questions, two costs: `plan` reads only the image's headers and answers how many
// `<|media_pad|>` tokens the image takes (so a prompt can be laid out and budgeted before any
// pixel is decoded); `encode` decodes, preprocesses and runs the tower, giving exactly that
// many rows of the text model's width. Every bad image is one InvalidArgument naming it; a bad
// checkpoint is an Error naming the file or tensor, raised by `open`.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/vision_tower.h"
#include "storage/checkpoint.h"
#include "vision/image.h"
#include "vision/preprocess.h"

namespace deltafin {

struct ImageEmbedding {
  vision::ImageInfo info;  // format, decoded width × height (the prompt's "image WxH"), mode
  vision::ImagePlan plan;  // resize, padding, patch grid, token count
  int64_t tokens = 0;
  int64_t hidden = 0;
  std::vector<float> rows;        // [tokens][hidden], token order of docs/VISION.md §4.9
  double preprocess_seconds = 0;  // decoding and the processor's steps
  double tower_seconds = 0;       // tower and projector
};

class VisionEncoder {
 public:
  // Opens the vision tower of the checkpoint folder `dir` (config.json with vision_config,
  // preprocessor_config.json with media_proc_cfg, the vision tensors; the text model's tensors
  // may be there or not and are not read). Compute runs on `pool` (null: the process-wide pool).
  static std::unique_ptr<VisionEncoder> open(const std::string& dir, ThreadPool* pool = nullptr,
                                             const vision::ImageLimits& limits = {});
  // The same over a checkpoint already opened (a loaded text model's), sharing its mapping.
  static std::unique_ptr<VisionEncoder> open(std::shared_ptr<const Checkpoint> ck,
                                             ThreadPool* pool = nullptr,
                                             const vision::ImageLimits& limits = {});

  const VisionConfig& config() const { return tower_->config(); }
  const vision::MediaProcConfig& media_config() const { return media_; }
  const vision::ImageLimits& limits() const { return limits_; }

  // Headers only: the decoded size and the plan, whose num_tokens is the number of rows encode
  // gives. Throws InvalidArgument naming `name`.
  vision::ImagePlan plan(std::span<const uint8_t> bytes, const std::string& name,
                         vision::ImageInfo* info = nullptr) const;
  // Decode, preprocess (bit-exact with the reference processor), tower, projector.
  ImageEmbedding encode(std::span<const uint8_t> bytes, const std::string& name) const;
  // The tower and projector over a pixel tensor (several frames allowed, §3.8).
  std::vector<float> encode_pixels(const vision::PixelTensor& pixels,
                                   const VisionTap& tap = {}) const;

  VisionEncoder(std::shared_ptr<const Checkpoint> ck, VisionConfig config,
                vision::MediaProcConfig media, ThreadPool* pool, vision::ImageLimits limits);

 private:
  std::shared_ptr<const Checkpoint> checkpoint_;  // the tower's matrices view its mapping
  std::unique_ptr<VisionTower> tower_;
  vision::MediaProcConfig media_;
  ThreadPool* pool_;
  vision::ImageLimits limits_;
};

}  // namespace deltafin
