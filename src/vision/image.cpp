// Format identification from the bytes, the shared size checks, and Pillow's conversions to RGB
// and RGBA (docs/VISION.md §3.1–3.2). The decoders themselves are decode_*.cpp.
#include "vision/image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/enum_names.h"
#include "core/error.h"
#include "vision/decoders.h"

namespace deltafin::vision {

std::vector<uint8_t> read_image_file(const std::string& path, const ImageLimits& limits) {
  // O_NONBLOCK: a FIFO or device named as an image must not block the open; fstat refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail_arg("{}: cannot open the image: {}", path, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_arg("{}: cannot read the image: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail_arg("{}: not a regular file (expected an image file)", path);
  if (static_cast<uint64_t>(st.st_size) > limits.max_bytes) {
    fail_arg("{}: {} bytes, over the {}-byte image limit", path, static_cast<uint64_t>(st.st_size),
             limits.max_bytes);
  }
  std::vector<uint8_t> data(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_arg("{}: cannot read the image: {}", path, std::strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  data.resize(got);
  return data;
}

constexpr EnumName<ImageFormat> kImageFormatNames[] = {
    {ImageFormat::kPng, "PNG"},
    {ImageFormat::kJpeg, "JPEG"},
    {ImageFormat::kGif, "GIF"},
    {ImageFormat::kWebp, "WebP"},
};

const char* format_name(ImageFormat f) {
  return name_of(kImageFormatNames, f);
}

constexpr EnumName<PixelMode> kPixelModeNames[] = {
    {PixelMode::k1, "1"}, {PixelMode::kL, "L"},     {PixelMode::kLA, "LA"},
    {PixelMode::kP, "P"}, {PixelMode::kRGB, "RGB"}, {PixelMode::kRGBA, "RGBA"},
};

const char* mode_name(PixelMode m) {
  return name_of(kPixelModeNames, m);
}

int mode_channels(PixelMode m) {
  switch (m) {
    case PixelMode::kLA:
      return 2;
    case PixelMode::kRGB:
      return 3;
    case PixelMode::kRGBA:
      return 4;
    default:
      return 1;
  }
}

namespace {

bool starts_with(std::span<const uint8_t> b, const char* magic, size_t n, size_t at = 0) {
  return b.size() >= at + n && std::memcmp(b.data() + at, magic, n) == 0;
}

// What other common files look like, for a refusal that says what was sent.
const char* other_format(std::span<const uint8_t> b) {
  if (starts_with(b, "BM", 2)) return "a BMP image";
  if (starts_with(b, "II*\0", 4) || starts_with(b, "MM\0*", 4)) return "a TIFF image";
  if (starts_with(b, "\0\0\1\0", 4)) return "an ICO image";
  if (starts_with(b, "ftyp", 4, 4)) return "an ISO media file (AVIF, HEIC or MP4)";
  if (starts_with(b, "%PDF", 4)) return "a PDF document";
  if (starts_with(b, "<svg", 4) || starts_with(b, "<?xml", 5)) return "an SVG or XML document";
  if (starts_with(b, "\0\0\0\x0cjP  ", 8)) return "a JPEG 2000 image";
  if (starts_with(b, "RIFF", 4)) return "a RIFF file that is not WebP";
  if (starts_with(b, "\x89PNG", 4)) return "a damaged PNG signature";
  return nullptr;
}

}  // namespace

void check_size(int64_t width, int64_t height, const std::string& name, const char* format,
                const ImageLimits& limits) {
  if (width <= 0 || height <= 0) {
    fail_arg("{}: the {} header says {}x{}; expected a positive width and height", name, format,
             width, height);
  }
  // Both are below 2^32 (every format stores them in at most 32 bits), so the product is exact.
  const uint64_t pixels = static_cast<uint64_t>(width) * static_cast<uint64_t>(height);
  if (pixels > limits.max_pixels) {
    fail_arg(
        "{}: {} image of {}x{} = {} pixels, over the limit of {} pixels (refused before "
        "decoding, as a possible decompression bomb)",
        name, format, width, height, pixels, limits.max_pixels);
  }
}

ImageFormat sniff_format(std::span<const uint8_t> b, const std::string& name) {
  if (b.empty()) fail_arg("{}: empty file; expected a PNG, JPEG, GIF or WebP image", name);
  if (starts_with(b, "\x89PNG\r\n\x1a\n", 8)) return ImageFormat::kPng;
  if (starts_with(b, "\xff\xd8\xff", 3)) return ImageFormat::kJpeg;
  if (starts_with(b, "GIF87a", 6) || starts_with(b, "GIF89a", 6)) return ImageFormat::kGif;
  if (starts_with(b, "RIFF", 4) && starts_with(b, "WEBP", 4, 8)) return ImageFormat::kWebp;
  if (const char* other = other_format(b)) {
    fail_arg("{}: the bytes are {}; expected a PNG, JPEG, GIF or WebP image", name, other);
  }
  fail_arg("{}: not a recognised image (the first bytes match no PNG, JPEG, GIF or WebP signature)",
           name);
}

namespace {

void check_bytes(std::span<const uint8_t> bytes, const std::string& name,
                 const ImageLimits& limits) {
  if (bytes.size() > limits.max_bytes) {
    fail_arg("{}: {} bytes, over the {}-byte image limit", name, bytes.size(), limits.max_bytes);
  }
}

}  // namespace

ImageInfo probe_image(std::span<const uint8_t> bytes, const std::string& name,
                      const ImageLimits& limits) {
  check_bytes(bytes, name, limits);
  switch (sniff_format(bytes, name)) {
    case ImageFormat::kPng:
      return detail::probe_png(bytes, name, limits);
    case ImageFormat::kJpeg:
      return detail::probe_jpeg(bytes, name, limits);
    case ImageFormat::kGif:
      return detail::probe_gif(bytes, name, limits);
    case ImageFormat::kWebp:
      return detail::probe_webp(bytes, name, limits);
  }
  fail_arg("{}: unknown image format", name);
}

Image decode_image(std::span<const uint8_t> bytes, const std::string& name,
                   const ImageLimits& limits) {
  check_bytes(bytes, name, limits);
  switch (sniff_format(bytes, name)) {
    case ImageFormat::kPng:
      return detail::decode_png(bytes, name, limits);
    case ImageFormat::kJpeg:
      return detail::decode_jpeg(bytes, name, limits);
    case ImageFormat::kGif:
      return detail::decode_gif(bytes, name, limits);
    case ImageFormat::kWebp:
      return detail::decode_webp(bytes, name, limits);
  }
  fail_arg("{}: unknown image format", name);
}

namespace detail {

std::vector<uint8_t> pillow_palette(const uint8_t* rgb, int count) {
  std::vector<uint8_t> p(256 * 3);
  for (int i = 0; i < 256; ++i) {
    for (int c = 0; c < 3; ++c) {
      p[3 * i + c] = i < count ? rgb[3 * i + c] : static_cast<uint8_t>(i);
    }
  }
  return p;
}

}  // namespace detail

namespace {

// The alpha Pillow's convert("RGBA") gives pixel value `v` of a 1, L or P image.
uint8_t alpha_of(const Transparency& t, uint8_t v) {
  switch (t.kind) {
    case Transparency::Kind::kValue:
      return v == t.value ? 0 : 255;
    case Transparency::Kind::kPaletteAlpha:
      return v < t.palette_alpha.size() ? t.palette_alpha[v] : 255;
    case Transparency::Kind::kNone:
    case Transparency::Kind::kRgb:
      break;
  }
  return 255;
}

template <int kOut>
std::vector<uint8_t> convert(const Image& im) {
  const size_t n = static_cast<size_t>(im.width * im.height);
  if (im.pixels.size() != n * static_cast<size_t>(im.channels()))
    fail("image buffer of {} bytes does not hold {}x{} {}", im.pixels.size(), im.width, im.height,
         mode_name(im.mode));
  std::vector<uint8_t> out(n * kOut);
  const uint8_t* s = im.pixels.data();
  uint8_t* d = out.data();
  for (size_t i = 0; i < n; ++i, d += kOut) {
    uint8_t r, g, b, a = 255;
    switch (im.mode) {
      case PixelMode::k1:
      case PixelMode::kL:
        r = g = b = s[i];
        a = alpha_of(im.transparency, s[i]);
        break;
      case PixelMode::kLA:
        r = g = b = s[2 * i];
        a = s[2 * i + 1];
        break;
      case PixelMode::kP: {
        const uint8_t* e = im.palette.data() + 3 * s[i];
        r = e[0];
        g = e[1];
        b = e[2];
        a = alpha_of(im.transparency, s[i]);
        break;
      }
      case PixelMode::kRGB:
        r = s[3 * i];
        g = s[3 * i + 1];
        b = s[3 * i + 2];
        if (im.transparency.kind == Transparency::Kind::kRgb && r == im.transparency.rgb[0] &&
            g == im.transparency.rgb[1] && b == im.transparency.rgb[2]) {
          a = 0;
        }
        break;
      case PixelMode::kRGBA:
      default:
        r = s[4 * i];
        g = s[4 * i + 1];
        b = s[4 * i + 2];
        a = s[4 * i + 3];
        break;
    }
    d[0] = r;
    d[1] = g;
    d[2] = b;
    if constexpr (kOut == 4) d[3] = a;
  }
  return out;
}

}  // namespace

std::vector<uint8_t> to_rgb(const Image& im) {
  if (im.mode == PixelMode::kP && im.palette.size() != 256 * 3)
    fail("palette image without a 256-entry palette");
  return convert<3>(im);
}

std::vector<uint8_t> to_rgba(const Image& im) {
  if (im.mode == PixelMode::kP && im.palette.size() != 256 * 3)
    fail("palette image without a 256-entry palette");
  return convert<4>(im);
}

}  // namespace deltafin::vision
