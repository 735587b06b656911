// Fuzz body for the media-token splice (the `media` target): a chat request whose image parts a
// client chose, through the renderer with a real vision tower's measurer (the demo tower,
// written once per process), then the encoding that splices the projector's rows into the
// prompt in place of the <|media_pad|> ids (runtime/images.h). The renderer lays the segments
// out from the headers alone and the encoder decodes the bytes again, so the two must agree on
// every image whatever a client sends; and the splice must take rows only where the prompt holds
// pads of that image, never outside the prompt, whatever spans it is handed.
//
// Input: byte 0 chooses where the kept state ends (`from`: none, the middle, the end) and,
// with bit 2, a tampering of one image's span by the signed byte 1 (a wrong caller: the splice
// must refuse it with an Error or find it still valid); the rest is the request's JSON.
//
// Invariants checked: each rendered image's segment lies inside the ids, in order, its pads are
// the placeholder and its bounds the media markers; the spliced rows are at increasing positions
// at or after `from`, on placeholder ids, one row of the text width per pad of an encoded image;
// state_key_ids keeps the prompt's length and hides exactly the images' segments; a prompt as
// the renderer laid it out is refused only when an image's body does not decode (the renderer
// reads headers only; the server answers that 400 naming the part).
#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>

#include "core/error.h"
#include "engine/vision_encoder.h"
#include "fixtures/synthetic.h"
#include "fuzz_targets.h"
#include "runtime/images.h"
#include "server/api_error.h"
#include "server/request.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "vision/image.h"

namespace deltafin::fuzz {

namespace {

// The tiny K3 text preset with the demo vision tower, made once in the scratch folder.
struct MediaModel {
  std::unique_ptr<VisionEncoder> encoder;
  Tokenizer tokenizer;
  int64_t width = 0;
};

const MediaModel& media_model() {
  static const MediaModel m = [] {
    const std::string dir = (std::filesystem::path(scratch_dir()) / "media-model").string();
    SyntheticSpec spec = synthetic_preset("tiny");
    spec.vision = synthetic_vision_preset("demo");
    make_model(dir, spec);
    vision::ImageLimits limits;  // small: each input stays fast, the checks are what is tested
    limits.max_pixels = 1u << 18;
    limits.max_bytes = 1u << 18;
    MediaModel mm{VisionEncoder::open(dir, nullptr, limits), Tokenizer::load(dir), spec.hidden};
    return mm;
  }();
  return m;
}

void check_rendered(const RenderedPrompt& p, const Tokenizer& tok, int32_t pad) {
  const auto n = static_cast<int64_t>(p.ids.size());
  const int32_t begin = tok.special_id("<|media_begin|>").value_or(-1);
  const int32_t end = tok.special_id("<|media_end|>").value_or(-1);
  int64_t last = 0;
  for (const PromptImage& img : p.images) {
    fuzz_check(img.segment_begin >= last && img.segment_begin < img.pad_begin && img.tokens > 0 &&
                   img.pad_begin + img.tokens < img.segment_end && img.segment_end <= n,
               "a rendered image's segment is outside the prompt or out of order");
    fuzz_check(p.ids[static_cast<size_t>(img.segment_begin)] == begin &&
                   p.ids[static_cast<size_t>(img.segment_end - 1)] == end,
               "a rendered image's segment is not bounded by the media markers");
    for (int64_t i = img.pad_begin; i < img.pad_begin + img.tokens; ++i)
      fuzz_check(p.ids[static_cast<size_t>(i)] == pad, "a rendered image's pad is not a pad");
    last = img.segment_end;
  }
  const std::vector<int32_t> key = state_key_ids(p.ids, p.images);
  fuzz_check(key.size() == p.ids.size(), "the state key changed the prompt's length");
  size_t hidden = 0, segments = 0;
  for (size_t i = 0; i < key.size(); ++i) hidden += key[i] < 0 ? 1 : 0;
  for (const PromptImage& img : p.images)
    segments += static_cast<size_t>(img.segment_end - img.segment_begin);
  fuzz_check(hidden == segments, "the state key does not hide exactly the images' segments");
}

void check_spliced(const PositionRows& rows, const RenderedPrompt& p,
                   const std::vector<PromptImage>& images, int64_t from, int64_t width,
                   int32_t pad) {
  fuzz_check(rows.width == width, "the spliced rows have the wrong width");
  fuzz_check(rows.values.size() == rows.positions.size() * static_cast<size_t>(width),
             "the spliced rows' values do not match their positions");
  int64_t prev = -1, want = 0;
  for (int64_t pos : rows.positions) {
    fuzz_check(pos > prev && pos >= from && pos < static_cast<int64_t>(p.ids.size()),
               "a spliced row is out of order, in the kept state or outside the prompt");
    fuzz_check(p.ids[static_cast<size_t>(pos)] == pad, "a row was spliced over a non-pad id");
    prev = pos;
  }
  for (const PromptImage& img : images)
    want += std::max<int64_t>(0, img.pad_begin + img.tokens - std::max(from, img.pad_begin));
  fuzz_check(static_cast<int64_t>(rows.positions.size()) == want,
             "the splice did not take one row per pad after the kept state");
}

bool all_decode(const std::vector<PromptImage>& images, const vision::ImageLimits& limits) {
  for (const PromptImage& img : images) {
    try {
      vision::decode_image(
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(img.bytes->data()),
                                   img.bytes->size()),
          img.name, limits);
    } catch (const Error&) {
      return false;
    }
  }
  return true;
}

}  // namespace

void media(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const MediaModel& m = media_model();
  const int32_t pad = static_cast<int32_t>(m.encoder->config().placeholder_id);
  const uint8_t mode = data[0];
  const auto shift = static_cast<int8_t>(data[1]);
  RenderedPrompt p;
  try {
    const auto body =
        server::parse_body(std::string(reinterpret_cast<const char*>(data + 2), size - 2), 64);
    p = render_json(body, m.tokenizer, image_measurer(m.encoder.get()));
  } catch (const Error&) {
    return;
  } catch (const server::ApiError&) {
    return;
  }
  check_rendered(p, m.tokenizer, pad);
  const auto n = static_cast<int64_t>(p.ids.size());
  const int64_t from = (mode & 3) == 0 ? 0 : (mode & 3) == 1 ? n / 2 : n;
  std::vector<PromptImage> images = p.images;
  const bool tampered = (mode & 4) != 0 && !images.empty();
  if (tampered) {
    PromptImage& img = images[static_cast<size_t>(mode >> 3) % images.size()];
    if ((mode & 0x80) != 0) {
      img.tokens += shift;
    } else {
      img.pad_begin += shift;
    }
  }
  try {
    const PositionRows rows =
        encode_prompt_images(m.encoder.get(), p.ids, images, from, m.width, nullptr);
    check_spliced(rows, p, images, from, m.width, pad);
  } catch (const Error&) {
    // The renderer measured the headers only, so an image whose body does not decode is refused
    // here (the server's 400 naming the part); any other refusal needs a tampered span.
    fuzz_check(tampered || !all_decode(p.images, m.encoder->limits()),
               "the splice refused a prompt exactly as the renderer laid it out");
  }
}

}  // namespace deltafin::fuzz
