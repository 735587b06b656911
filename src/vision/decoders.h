// The four decoders behind image.h, one file each (decode_png.cpp, decode_jpeg.cpp,
// decode_gif.cpp, decode_webp.cpp). Each has a header-only probe and a full decode that agree on
// width, height and mode; both throw InvalidArgument naming the image. Internal to src/vision.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "vision/image.h"

namespace deltafin::vision::detail {

ImageInfo probe_png(std::span<const uint8_t> bytes, const std::string& name,
                    const ImageLimits& limits);
Image decode_png(std::span<const uint8_t> bytes, const std::string& name,
                 const ImageLimits& limits);

ImageInfo probe_jpeg(std::span<const uint8_t> bytes, const std::string& name,
                     const ImageLimits& limits);
Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& name,
                  const ImageLimits& limits);

ImageInfo probe_gif(std::span<const uint8_t> bytes, const std::string& name,
                    const ImageLimits& limits);
Image decode_gif(std::span<const uint8_t> bytes, const std::string& name,
                 const ImageLimits& limits);

ImageInfo probe_webp(std::span<const uint8_t> bytes, const std::string& name,
                     const ImageLimits& limits);
Image decode_webp(std::span<const uint8_t> bytes, const std::string& name,
                  const ImageLimits& limits);

// The undecoded bytes a library's read callback pulls from (libpng, giflib): where it is.
struct ByteSource {
  std::span<const uint8_t> bytes;
  size_t pos = 0;

  size_t left() const { return bytes.size() - pos; }
  // Copies min(n, left()) bytes to `out` and moves past them; returns how many.
  size_t take(uint8_t* out, size_t n) {
    const size_t k = n < left() ? n : left();
    if (k > 0) std::memcpy(out, bytes.data() + pos, k);
    pos += k;
    return k;
  }
};

// The palette Pillow gives a P image: the file's `count` RGB entries, then (i, i, i) up to 256.
std::vector<uint8_t> pillow_palette(const uint8_t* rgb, int count);

}  // namespace deltafin::vision::detail
