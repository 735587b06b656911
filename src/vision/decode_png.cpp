// PNG through libpng, giving the mode, palette and transparency Pillow 9.4 gives the same file
// (docs/VISION.md §3.1): grey 1-bit → "1" (0/255), 2- and 4-bit → "L" scaled by 85 and 17,
// 8-bit → "L"; 16-bit samples keep their high byte (Pillow's ";16B" unpackers; libpng's
// png_set_strip_16 drops the low byte the same way), except 16-bit grey, which Pillow decodes
// to mode "I" and this engine refuses by name; 16-bit grey+alpha becomes RGBA as in Pillow.
// A grey tRNS value is kept raw (Pillow compares it with the scaled pixel), a palette tRNS as
// per-entry alpha, an RGB one as the colour that is transparent (the reference never
// composites RGB images, so it only marks the image as Pillow's info["transparency"] does).
//
// Error handling: libpng reports errors by longjmp to the setjmp of the calling phase. Each
// phase (header, pixels) is a function that holds no C++ object with a destructor and only calls
// libpng, so a longjmp out of libpng skips nothing; the png_struct is owned by an RAII holder in
// the caller, outside the jump. Decompression bombs: the header's width × height is checked
// against the limits before the pixel buffer exists; text and profile chunks are not expanded.
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "vision/decoders.h"

namespace deltafin::vision::detail {

namespace {

struct PngMessage {
  char text[200];
};

void df_png_read_bytes(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<ByteSource*>(png_get_io_ptr(png));
  if (n > src->left()) png_error(png, "the file ends early (truncated)");
  src->take(out, n);
}

void df_png_on_error(png_structp png, png_const_charp msg) {
  auto* m = static_cast<PngMessage*>(png_get_error_ptr(png));
  std::snprintf(m->text, sizeof m->text, "%s", msg != nullptr ? msg : "unknown libpng error");
  png_longjmp(png, 1);
}

void df_png_on_warning(png_structp, png_const_charp) {}

// What the header says, copied out of libpng's structures (plain data).
struct PngHeader {
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0, interlace = 0;
  int num_palette = 0;
  png_byte palette[256 * 3] = {};
  int num_trans = 0;
  png_byte trans_alpha[256] = {};
  int trans_gray = -1;
  int trans_rgb[3] = {-1, -1, -1};
};

// Phase 1: the chunks before the image data. No C++ object lives in this frame.
bool read_header(png_structp png, png_infop info, PngHeader* h) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_info(png, info);
  png_get_IHDR(png, info, &h->width, &h->height, &h->bit_depth, &h->color_type, &h->interlace,
               nullptr, nullptr);
  png_colorp pal = nullptr;
  if (png_get_PLTE(png, info, &pal, &h->num_palette) != 0 && pal != nullptr) {
    if (h->num_palette > 256) h->num_palette = 256;
    for (int i = 0; i < h->num_palette; ++i) {
      h->palette[3 * i] = pal[i].red;
      h->palette[3 * i + 1] = pal[i].green;
      h->palette[3 * i + 2] = pal[i].blue;
    }
  } else {
    h->num_palette = 0;
  }
  png_bytep trans = nullptr;
  png_color_16p trans_color = nullptr;
  if (png_get_tRNS(png, info, &trans, &h->num_trans, &trans_color) != 0) {
    if (h->color_type == PNG_COLOR_TYPE_PALETTE && trans != nullptr) {
      if (h->num_trans > 256) h->num_trans = 256;
      std::memcpy(h->trans_alpha, trans, static_cast<size_t>(h->num_trans));
    } else if (h->color_type == PNG_COLOR_TYPE_GRAY && trans_color != nullptr) {
      h->trans_gray = trans_color->gray;
    } else if (h->color_type == PNG_COLOR_TYPE_RGB && trans_color != nullptr) {
      h->trans_rgb[0] = trans_color->red;
      h->trans_rgb[1] = trans_color->green;
      h->trans_rgb[2] = trans_color->blue;
    }
  }
  return true;
}

// Phase 2: every row into `rows` (8 bits per sample, one sample per byte). No C++ object here.
bool read_pixels(png_structp png, png_infop info, const PngHeader* h, png_bytepp rows,
                 size_t row_bytes, PngMessage* msg) {
  if (setjmp(png_jmpbuf(png))) return false;
  if (h->bit_depth == 16) png_set_strip_16(png);
  if (h->bit_depth < 8) png_set_packing(png);
  if (h->interlace != PNG_INTERLACE_NONE) png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != row_bytes) {
    std::snprintf(msg->text, sizeof msg->text, "unexpected row size %zu (expected %zu)",
                  static_cast<size_t>(png_get_rowbytes(png, info)), row_bytes);
    return false;
  }
  png_read_image(png, rows);
  return true;
}

// Owns libpng's structures for one image.
class PngReader {
 public:
  PngReader(std::span<const uint8_t> bytes, const std::string& name) : name_(name) {
    src_ = {bytes, 0};
    png_ = png_create_read_struct(PNG_LIBPNG_VER_STRING, &msg_, df_png_on_error, df_png_on_warning);
    if (png_ == nullptr) fail_arg("{}: cannot start the PNG decoder (out of memory)", name);
    info_ = png_create_info_struct(png_);
    if (info_ == nullptr) {
      png_destroy_read_struct(&png_, nullptr, nullptr);  // no destructor runs for a throw here
      fail_arg("{}: cannot start the PNG decoder (out of memory)", name);
    }
    png_set_read_fn(png_, &src_, df_png_read_bytes);
    // Pillow has no per-side limit: the pixel count is checked below instead of libpng's default
    // 1,000,000-per-side limit. Ancillary chunks are bounded and text/profile chunks skipped.
    png_set_user_limits(png_, 0x7fffffff, 0x7fffffff);
    png_set_chunk_cache_max(png_, 256);
    png_set_chunk_malloc_max(png_, 8u << 20);
    static const png_byte kSkipped[] = "tEXt\0zTXt\0iTXt\0iCCP\0sPLT\0eXIf\0";
    png_set_keep_unknown_chunks(png_, PNG_HANDLE_CHUNK_NEVER, kSkipped, 6);
    png_set_benign_errors(png_, 1);
#ifdef PNG_CHECK_FOR_INVALID_INDEX_SUPPORTED
    // Pillow maps an index past the palette to grey (i, i, i); libpng must not refuse it.
    png_set_check_for_invalid_index(png_, 0);
#endif
  }
  ~PngReader() {
    png_destroy_read_struct(&png_, &info_, nullptr);
  }
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;

  const PngHeader& header(const ImageLimits& limits) {
    // The size from IHDR (the first chunk) before libpng sees it, so a zero or bomb size gets
    // the same clear error in every format.
    if (src_.bytes.size() >= 24 && std::memcmp(src_.bytes.data() + 12, "IHDR", 4) == 0) {
      auto be32 = [&](size_t at) {
        return int64_t{src_.bytes.data()[at]} << 24 | int64_t{src_.bytes.data()[at + 1]} << 16 |
               int64_t{src_.bytes.data()[at + 2]} << 8 | int64_t{src_.bytes.data()[at + 3]};
      };
      check_size(be32(16), be32(20), name_, "PNG", limits);
    }
    if (!read_header(png_, info_, &h_)) fail_arg("{}: not a valid PNG ({})", name_, msg_.text);
    check_size(h_.width, h_.height, name_, "PNG", limits);
    mode_ = mode_of(h_);
    return h_;
  }
  PixelMode mode() const {
    return mode_;
  }

  // The samples as libpng gives them after strip_16/packing: `channels` bytes per pixel.
  std::vector<uint8_t> samples(int channels) {
    const size_t row = static_cast<size_t>(h_.width) * static_cast<size_t>(channels);
    std::vector<uint8_t> buf(row * h_.height);
    std::vector<png_bytep> rows(h_.height);
    for (png_uint_32 y = 0; y < h_.height; ++y) rows[y] = buf.data() + row * y;
    if (!read_pixels(png_, info_, &h_, rows.data(), row, &msg_))
      fail_arg("{}: the PNG image data cannot be decoded ({})", name_, msg_.text);
    return buf;
  }

 private:
  PixelMode mode_of(const PngHeader& h) const {
    switch (h.color_type) {
      case PNG_COLOR_TYPE_GRAY:
        if (h.bit_depth == 16) {
          fail_arg(
              "{}: 16-bit greyscale PNG (Pillow mode I) is not supported; expected 1-, 2-, 4- or "
              "8-bit greyscale, RGB, RGBA, grey+alpha or palette (docs/VISION.md §3.1)",
              name_);
        }
        return h.bit_depth == 1 ? PixelMode::k1 : PixelMode::kL;
      case PNG_COLOR_TYPE_RGB:
        return PixelMode::kRGB;
      case PNG_COLOR_TYPE_PALETTE:
        return PixelMode::kP;
      case PNG_COLOR_TYPE_GRAY_ALPHA:
        return h.bit_depth == 16 ? PixelMode::kRGBA : PixelMode::kLA;
      case PNG_COLOR_TYPE_RGB_ALPHA:
        return PixelMode::kRGBA;
      default:
        fail_arg("{}: PNG colour type {} is not valid", name_, h.color_type);
    }
  }

  std::string name_;
  ByteSource src_{};
  PngMessage msg_{};
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
  PngHeader h_;
  PixelMode mode_ = PixelMode::kRGB;
};

}  // namespace

ImageInfo probe_png(std::span<const uint8_t> bytes, const std::string& name,
                    const ImageLimits& limits) {
  PngReader r(bytes, name);
  const PngHeader& h = r.header(limits);
  return {ImageFormat::kPng, static_cast<int64_t>(h.width), static_cast<int64_t>(h.height),
          r.mode()};
}

Image decode_png(std::span<const uint8_t> bytes, const std::string& name,
                 const ImageLimits& limits) {
  PngReader r(bytes, name);
  const PngHeader& h = r.header(limits);
  Image im;
  im.width = h.width;
  im.height = h.height;
  im.mode = r.mode();
  const bool grey_alpha16 =
      h.color_type == PNG_COLOR_TYPE_GRAY_ALPHA && im.mode == PixelMode::kRGBA;
  if (grey_alpha16) {
    // Pillow's "LA;16B" → RGBA: the grey high byte on R, G and B, the alpha high byte on A.
    const std::vector<uint8_t> la = r.samples(2);
    im.pixels.resize(la.size() * 2);
    for (size_t i = 0, n = la.size() / 2; i < n; ++i) {
      uint8_t* p = im.pixels.data() + 4 * i;
      p[0] = p[1] = p[2] = la[2 * i];
      p[3] = la[2 * i + 1];
    }
  } else {
    im.pixels = r.samples(im.channels());
  }
  if (h.color_type == PNG_COLOR_TYPE_GRAY) {
    // Pillow's unpackers scale 1-, 2- and 4-bit grey to 8 bits (1-bit: mode "1", 0 or 255).
    const int scale = h.bit_depth == 1 ? 255 : h.bit_depth == 2 ? 85 : h.bit_depth == 4 ? 17 : 1;
    if (scale != 1) {
      for (uint8_t& v : im.pixels) v = static_cast<uint8_t>(v * scale);
    }
    if (h.trans_gray >= 0) {
      im.transparency.kind = Transparency::Kind::kValue;
      im.transparency.value = h.trans_gray;
    }
  }
  if (h.color_type == PNG_COLOR_TYPE_RGB && h.trans_rgb[0] >= 0) {
    im.transparency.kind = Transparency::Kind::kRgb;
    for (int c = 0; c < 3; ++c) im.transparency.rgb[c] = h.trans_rgb[c];
  }
  if (h.color_type == PNG_COLOR_TYPE_PALETTE) {
    if (h.num_palette == 0) fail_arg("{}: palette PNG without a PLTE chunk", name);
    im.palette = pillow_palette(h.palette, h.num_palette);
    if (h.num_trans > 0) {
      im.transparency.kind = Transparency::Kind::kPaletteAlpha;
      im.transparency.palette_alpha.assign(h.trans_alpha, h.trans_alpha + h.num_trans);
    }
  }
  return im;
}

}  // namespace deltafin::vision::detail
