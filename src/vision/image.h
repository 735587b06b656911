// Image files in, 8-bit pixels out, exactly as the K3 reference processor sees them
// (docs/VISION.md §3.1): the reference opens the bytes with Pillow 9.4 and uses frame 0 in the
// mode Pillow gives, so this layer reproduces Pillow's choices — which mode a file decodes to,
// what its palette and `transparency` entry hold — with the same system libraries Pillow uses on
// Debian 12 (libjpeg62-turbo with default options, libwebp's animation decoder) or, where Pillow
// has its own decoder (PNG's unfiltering, GIF's LZW), with libpng and giflib, which compute the
// same pixels for a well-formed file.
//
// Why it is built this way:
// - Images come from clients and are hostile: the format is identified from the bytes (magic),
//   never from a name or a MIME type; the header's width × height is checked against the limits
//   before any pixel buffer is allocated; every failure is one InvalidArgument naming the image
//   and what was expected. The C libraries report errors through setjmp/longjmp (libpng, libjpeg)
//   or return codes (giflib, libwebp); the longjmp lands in small functions that own no C++
//   object (decode_*.cpp), so no destructor is ever skipped.
// - Memory per image is bounded by the limits (ImageLimits; docs/VISION.md §3.1 states the
//   bound): the decoded frame is width × height × channels bytes, at most 4 per pixel.
// - `probe_image` reads headers only and gives the same width, height and mode as a full decode,
//   so a caller can know the token count (preprocess.h: plan_image) before decoding.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace deltafin::vision {

enum class ImageFormat { kPng, kJpeg, kGif, kWebp };
const char* format_name(ImageFormat f);

// Pillow's modes that this engine decodes into (docs/VISION.md §3.1). Others (16-bit grey,
// CMYK, …) are refused with an error naming the mode.
enum class PixelMode {
  k1,     // bilevel, stored as 0 / 255 per byte (as Pillow's "1")
  kL,     // grey
  kLA,    // grey + alpha, 2 bytes per pixel
  kP,     // palette indices, with `palette` (and maybe `transparency`)
  kRGB,   // 3 bytes per pixel
  kRGBA,  // 4 bytes per pixel, alpha not premultiplied
};
const char* mode_name(PixelMode m);
int mode_channels(PixelMode m);

// Pillow's info["transparency"] of a decoded image.
struct Transparency {
  enum class Kind {
    kNone,
    // L or 1: a pixel whose (8-bit, scaled) value equals `value` is transparent. `value` is the
    // file's raw sample (Pillow compares it unscaled; a value above 255 never matches).
    kValue,
    // P: alpha of palette entry i is palette_alpha[i] for i < size, else 255 (PNG tRNS).
    kPaletteAlpha,
    // RGB: a pixel equal to `rgb` (raw samples, as for kValue) is transparent in RGBA. The
    // reference never composites an RGB image (§3.2 step 1), so this only shows in to_rgba.
    kRgb,
  };
  Kind kind = Kind::kNone;
  int value = 0;
  int rgb[3] = {0, 0, 0};
  std::vector<uint8_t> palette_alpha;
  bool present() const { return kind != Kind::kNone; }
};

struct Image {
  PixelMode mode = PixelMode::kRGB;
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> pixels;   // row-major, mode_channels(mode) bytes per pixel
  std::vector<uint8_t> palette;  // P: 256 × RGB; entries the file does not define are (i, i, i)
  Transparency transparency;
  int channels() const { return mode_channels(mode); }
};

// What an image may cost. The defaults are the reference's (tools/vision/k3_vision_pre.py):
// 64 MiB of file and Pillow's decompression-bomb limit of 2 × 89,478,485 pixels.
struct ImageLimits {
  uint64_t max_bytes = uint64_t{64} << 20;
  uint64_t max_pixels = 178'956'970;
};

struct ImageInfo {
  ImageFormat format = ImageFormat::kPng;
  int64_t width = 0;
  int64_t height = 0;
  PixelMode mode = PixelMode::kRGB;
};

// The format from the first bytes; throws InvalidArgument naming `name` when they are none of
// PNG, JPEG, GIF and WebP (saying what they look like when it is another known format).
ImageFormat sniff_format(std::span<const uint8_t> bytes, const std::string& name);

// Headers only: format, size and mode of frame 0, with every limit and refusal of a full decode
// that the headers decide. Throws InvalidArgument naming `name`.
ImageInfo probe_image(std::span<const uint8_t> bytes, const std::string& name,
                      const ImageLimits& limits = {});

// The bytes of the image file `path`: a regular file of at most limits.max_bytes (checked
// before reading). Throws InvalidArgument naming the path.
std::vector<uint8_t> read_image_file(const std::string& path, const ImageLimits& limits = {});

// SHA-256 of an image's bytes (image_hash.cpp): what the prefix store keys an image's positions
// by, so a state is reused only for the very same image (docs/VISION.md §11.7).
std::array<uint8_t, 32> image_sha256(std::span<const uint8_t> bytes);

// Decodes frame 0. Throws InvalidArgument naming `name` and what was expected.
Image decode_image(std::span<const uint8_t> bytes, const std::string& name,
                   const ImageLimits& limits = {});

// Pillow's convert("RGB") and convert("RGBA") of any decoded mode (palette lookup, grey
// spread to three channels, `transparency` turned into alpha for RGBA; docs/VISION.md §3.2).
std::vector<uint8_t> to_rgb(const Image& im);
std::vector<uint8_t> to_rgba(const Image& im);

// The checks every decoder makes once it knows the size (shared by the decoders): positive
// width and height, width × height within the limit. Throws InvalidArgument naming `name`.
void check_size(int64_t width, int64_t height, const std::string& name, const char* format,
                const ImageLimits& limits);

}  // namespace deltafin::vision
