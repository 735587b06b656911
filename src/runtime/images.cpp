// Images into a prompt (see images.h).
#include "runtime/images.h"

#include "core/error.h"
#include "core/timer.h"
#include "vision/image.h"

namespace deltafin {

namespace {

std::span<const uint8_t> image_bytes(const std::shared_ptr<const std::string>& b) {
  if (!b) return {};
  return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(b->data()), b->size());
}

[[noreturn]] void no_tower(const std::string& name) {
  fail_arg(
      "{}: this model has no vision tower (its checkpoint holds no vision_tower.* / "
      "mm_projector.* tensors), so it cannot take images",
      name);
}

}  // namespace

ImageMeasurer image_measurer(const VisionEncoder* encoder) {
  return [encoder](const ChatImage& img) {
    if (encoder == nullptr) no_tower(img.name);
    vision::ImageInfo info;
    const vision::ImagePlan plan = encoder->plan(image_bytes(img.bytes), img.name, &info);
    ImageMeasure m;
    m.width = info.width;
    m.height = info.height;
    m.tokens = plan.num_tokens;
    m.hash = vision::image_sha256(image_bytes(img.bytes));
    return m;
  };
}

PositionRows encode_prompt_images(const VisionEncoder* encoder, std::span<const int32_t> ids,
                                  std::span<const PromptImage> images, int64_t from, int64_t width,
                                  ImageEncodeStats* stats) {
  PositionRows rows;
  rows.width = width;
  ImageEncodeStats st;
  const auto n = static_cast<int64_t>(ids.size());
  int64_t last_end = 0;
  for (const PromptImage& img : images) {
    ++st.images;
    st.tokens += img.tokens;
    if (encoder == nullptr) no_tower(img.name);
    const int64_t pad = encoder->config().placeholder_id;
    if (img.tokens <= 0 || img.pad_begin < last_end || img.pad_begin > n - img.tokens)
      fail_arg("{}: its {} image tokens at {} lie outside the prompt's {} tokens or overlap",
               img.name, img.tokens, img.pad_begin, n);
    for (int64_t p = img.pad_begin; p < img.pad_begin + img.tokens; ++p) {
      if (ids[static_cast<size_t>(p)] != pad)
        fail_arg("{}: position {} of its image tokens holds id {}, not the media placeholder {}",
                 img.name, p, ids[static_cast<size_t>(p)], pad);
    }
    last_end = img.pad_begin + img.tokens;
    if (last_end <= from) continue;  // all in the kept state
    if (encoder->config().text_hidden != width)
      fail_arg("{}: the vision tower's rows are {} wide, the text model's {}", img.name,
               encoder->config().text_hidden, width);
    Stopwatch sw;
    const ImageEmbedding e = encoder->encode(image_bytes(img.bytes), img.name);
    st.seconds += sw.elapsed();
    ++st.encoded;
    st.encoded_tokens += e.tokens;
    if (e.tokens != img.tokens)
      fail_arg("{}: the tower gave {} rows for the prompt's {} image tokens", img.name, e.tokens,
               img.tokens);
    const auto w = static_cast<size_t>(width);
    for (int64_t t = 0; t < img.tokens; ++t) {
      const int64_t p = img.pad_begin + t;
      if (p < from) continue;
      rows.positions.push_back(p);
      const auto src = e.rows.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(t) * w);
      rows.values.insert(rows.values.end(), src, src + static_cast<ptrdiff_t>(w));
    }
  }
  if (stats != nullptr) *stats = st;
  return rows;
}

}  // namespace deltafin
