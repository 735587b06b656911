// WebP through libwebp's animation decoder, as Pillow 9.4 decodes every WebP file on Debian 12
// (docs/VISION.md §3.1): frame 0 of the canvas in MODE_RGBA (not premultiplied, libwebp's
// default fancy upsampling); mode "RGBA" when the bitstream has alpha, else "RGB" (the canvas's
// colour bytes). A still image is its own one-frame animation, decoded by the same path.
//
// libwebp reports errors by return codes. The canvas size (WebPGetFeatures: the VP8X canvas or
// the bitstream's size) is checked against the limits before the decoder allocates the canvas
// (and its copy of the previous frame: 8 bytes per pixel while decoding).
#include <webp/decode.h>
#include <webp/demux.h>

#include <cstring>

#include "core/error.h"
#include "vision/decoders.h"

namespace deltafin::vision::detail {

namespace {

ImageInfo webp_info(std::span<const uint8_t> bytes, const std::string& name,
                    const ImageLimits& limits) {
  WebPBitstreamFeatures f;
  const VP8StatusCode st = WebPGetFeatures(bytes.data(), bytes.size(), &f);
  if (st != VP8_STATUS_OK) {
    fail_arg("{}: not a valid WebP ({})", name,
             st == VP8_STATUS_NOT_ENOUGH_DATA ? "the file ends early (truncated)"
                                              : "bad bitstream header");
  }
  check_size(f.width, f.height, name, "WebP", limits);
  return {ImageFormat::kWebp, f.width, f.height, f.has_alpha ? PixelMode::kRGBA : PixelMode::kRGB};
}

struct AnimDecoder {
  WebPAnimDecoder* dec = nullptr;
  ~AnimDecoder() {
    if (dec != nullptr) WebPAnimDecoderDelete(dec);
  }
};

}  // namespace

ImageInfo probe_webp(std::span<const uint8_t> bytes, const std::string& name,
                     const ImageLimits& limits) {
  return webp_info(bytes, name, limits);
}

Image decode_webp(std::span<const uint8_t> bytes, const std::string& name,
                  const ImageLimits& limits) {
  const ImageInfo info = webp_info(bytes, name, limits);
  WebPAnimDecoderOptions opt;
  if (!WebPAnimDecoderOptionsInit(&opt)) fail_arg("{}: libwebp version mismatch", name);
  opt.color_mode = MODE_RGBA;
  opt.use_threads = 0;
  WebPData data{bytes.data(), bytes.size()};
  AnimDecoder d;
  d.dec = WebPAnimDecoderNew(&data, &opt);
  if (d.dec == nullptr)
    fail_arg("{}: the WebP file cannot be decoded (malformed or truncated)", name);
  WebPAnimInfo ai;
  if (!WebPAnimDecoderGetInfo(d.dec, &ai)) fail_arg("{}: the WebP file cannot be decoded", name);
  if (static_cast<int64_t>(ai.canvas_width) != info.width ||
      static_cast<int64_t>(ai.canvas_height) != info.height) {
    fail_arg("{}: WebP canvas {}x{} differs from its header's {}x{}", name, ai.canvas_width,
             ai.canvas_height, info.width, info.height);
  }
  uint8_t* buf = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderGetNext(d.dec, &buf, &timestamp) || buf == nullptr)
    fail_arg("{}: the WebP image data cannot be decoded (malformed or truncated)", name);
  Image im;
  im.mode = info.mode;
  im.width = info.width;
  im.height = info.height;
  const size_t n = static_cast<size_t>(info.width * info.height);
  if (im.mode == PixelMode::kRGBA) {
    im.pixels.assign(buf, buf + 4 * n);
  } else {
    im.pixels.resize(3 * n);
    for (size_t i = 0; i < n; ++i) std::memcpy(im.pixels.data() + 3 * i, buf + 4 * i, 3);
  }
  return im;
}

}  // namespace deltafin::vision::detail
