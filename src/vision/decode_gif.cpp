// GIF frame 0 through giflib's low-level API, giving what Pillow 9.4's GIF plugin gives
// (docs/VISION.md §3.1): the canvas is the logical screen, grown to hold frame 0 if it reaches
// past it; pixels outside frame 0 hold its transparent index when it has one, else 0; the frame's
// own colour table, else the global one, is the palette — unless a table is the grey ramp
// (entry i = (i, i, i)), which Pillow drops: then the global table serves (a quirk of Pillow's
// loading: the indices are looked up in it), and with no usable table the image is mode "L"
// holding the indices; the last graphic control extension before the frame gives the
// transparent index (info["transparency"]).
//
// giflib reports errors by return codes (no longjmp). Every loop is bounded: records and
// extension sub-blocks each consume input, and their number is capped by the input's size.
// The canvas size is checked against the limits before it is allocated.
#include <gif_lib.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "vision/decoders.h"

namespace deltafin::vision::detail {

namespace {

int df_gif_read(GifFileType* gif, GifByteType* out, int n) {
  if (n <= 0) return 0;
  return static_cast<int>(static_cast<ByteSource*>(gif->UserData)->take(out, size_t(n)));
}

const char* gif_error_text(int code) {
  const char* t = GifErrorString(code);
  return t != nullptr ? t : "unknown giflib error";
}

bool is_grey_ramp(const ColorMapObject* map) {
  for (int i = 0; i < map->ColorCount; ++i) {
    const GifColorType& c = map->Colors[i];
    if (!(c.Red == i && c.Green == i && c.Blue == i)) return false;
  }
  return true;
}

// Opens the GIF and walks to frame 0's image descriptor.
class GifReader {
 public:
  GifReader(std::span<const uint8_t> bytes, const std::string& name) : name_(name) {
    src_ = {bytes, 0};
    int err = 0;
    gif_ = DGifOpen(&src_, df_gif_read, &err);
    if (gif_ == nullptr) fail_arg("{}: not a valid GIF ({})", name_, gif_error_text(err));
  }
  ~GifReader() {
    int err = 0;
    if (gif_ != nullptr) DGifCloseFile(gif_, &err);
  }
  GifReader(const GifReader&) = delete;
  GifReader& operator=(const GifReader&) = delete;

  [[noreturn]] void fail_gif(const char* what) const {
    fail_arg("{}: the GIF {} cannot be read ({})", name_, what, gif_error_text(gif_->Error));
  }

  // Reads records up to frame 0's descriptor; fills the canvas size, mode and transparency.
  ImageInfo frame0(const ImageLimits& limits) {
    // Each record consumes at least one byte, so there are at most size() of them.
    for (size_t records = 0; records <= src_.bytes.size(); ++records) {
      GifRecordType type = UNDEFINED_RECORD_TYPE;
      if (DGifGetRecordType(gif_, &type) == GIF_ERROR) fail_gif("record");
      if (type == EXTENSION_RECORD_TYPE) {
        int code = 0;
        GifByteType* ext = nullptr;
        if (DGifGetExtension(gif_, &code, &ext) == GIF_ERROR) fail_gif("extension");
        if (code == GRAPHICS_EXT_FUNC_CODE && ext != nullptr) {
          if (ext[0] < 4)
            fail_arg("{}: graphic control extension of {} bytes (expected 4)", name_,
                     static_cast<int>(ext[0]));
          if ((ext[1] & 1) != 0) transparent_ = ext[4];
        }
        for (size_t blocks = 0; ext != nullptr; ++blocks) {
          if (blocks > src_.bytes.size()) fail_arg("{}: endless GIF extension", name_);
          if (DGifGetExtensionNext(gif_, &ext) == GIF_ERROR) fail_gif("extension");
        }
      } else if (type == IMAGE_DESC_RECORD_TYPE) {
        if (DGifGetImageDesc(gif_) == GIF_ERROR) fail_gif("image descriptor");
        return describe(limits);
      } else if (type == TERMINATE_RECORD_TYPE) {
        fail_arg("{}: the GIF holds no image", name_);
      } else {
        fail_arg("{}: unexpected GIF record", name_);
      }
    }
    fail_arg("{}: no GIF image descriptor found", name_);
  }

  // Frame 0's pixels on the canvas.
  Image pixels() {
    Image im;
    im.mode = mode_;
    im.width = width_;
    im.height = height_;
    const GifImageDesc& d = gif_->Image;
    im.pixels.assign(static_cast<size_t>(width_ * height_),
                     static_cast<uint8_t>(transparent_ >= 0 ? transparent_ : 0));
    std::vector<GifPixelType> line(static_cast<size_t>(d.Width));
    // Row order in the stream: the four interlace passes, or top to bottom.
    static const int kStart[4] = {0, 4, 2, 1}, kStep[4] = {8, 8, 4, 2};
    const int passes = d.Interlace ? 4 : 1;
    for (int p = 0; p < passes; ++p) {
      const int start = d.Interlace ? kStart[p] : 0, step = d.Interlace ? kStep[p] : 1;
      for (int y = start; y < d.Height; y += step) {
        if (DGifGetLine(gif_, line.data(), d.Width) == GIF_ERROR) fail_gif("image data");
        std::memcpy(im.pixels.data() + static_cast<size_t>((d.Top + y) * width_ + d.Left),
                    line.data(), line.size());
      }
    }
    if (mode_ == PixelMode::kP) {
      const ColorMapObject* map = palette_;
      std::vector<uint8_t> rgb(static_cast<size_t>(map->ColorCount) * 3);
      for (int i = 0; i < map->ColorCount; ++i) {
        rgb[3 * i] = map->Colors[i].Red;
        rgb[3 * i + 1] = map->Colors[i].Green;
        rgb[3 * i + 2] = map->Colors[i].Blue;
      }
      im.palette = pillow_palette(rgb.data(), std::min(map->ColorCount, 256));
      if (transparent_ >= 0) {
        im.transparency.kind = Transparency::Kind::kPaletteAlpha;
        im.transparency.palette_alpha.assign(256, 255);
        im.transparency.palette_alpha[static_cast<size_t>(transparent_)] = 0;
      }
    } else if (transparent_ >= 0) {
      im.transparency.kind = Transparency::Kind::kValue;
      im.transparency.value = transparent_;
    }
    return im;
  }

 private:
  ImageInfo describe(const ImageLimits& limits) {
    const GifImageDesc& d = gif_->Image;
    if (d.Width <= 0 || d.Height <= 0 || d.Left < 0 || d.Top < 0) {
      fail_arg("{}: GIF frame 0 is {}x{} at ({}, {}); expected a positive size", name_, d.Width,
               d.Height, d.Left, d.Top);
    }
    width_ = std::max<int64_t>(gif_->SWidth, int64_t{d.Left} + d.Width);
    height_ = std::max<int64_t>(gif_->SHeight, int64_t{d.Top} + d.Height);
    check_size(width_, height_, name_, "GIF", limits);
    // Pillow keeps no palette for a grey-ramp table. Frame 0 uses its own table unless that is a
    // ramp; then (or without one) the global table, applied to the indices, makes the image P;
    // only with no usable table at all is the image L, holding the indices.
    auto usable = [&](const ColorMapObject* map) -> const ColorMapObject* {
      if (map == nullptr) return nullptr;
      if (map->ColorCount <= 0 || map->ColorCount > 256)
        fail_arg("{}: GIF colour table of {} entries", name_, map->ColorCount);
      return is_grey_ramp(map) ? nullptr : map;
    };
    const ColorMapObject* global = usable(gif_->SColorMap);
    const ColorMapObject* local = usable(d.ColorMap);
    palette_ = local != nullptr ? local : global;
    mode_ = palette_ != nullptr ? PixelMode::kP : PixelMode::kL;
    return {ImageFormat::kGif, width_, height_, mode_};
  }

  std::string name_;
  ByteSource src_{};
  GifFileType* gif_ = nullptr;
  int transparent_ = -1;
  int64_t width_ = 0, height_ = 0;
  PixelMode mode_ = PixelMode::kP;
  const ColorMapObject* palette_ = nullptr;
};

}  // namespace

ImageInfo probe_gif(std::span<const uint8_t> bytes, const std::string& name,
                    const ImageLimits& limits) {
  GifReader r(bytes, name);
  return r.frame0(limits);
}

Image decode_gif(std::span<const uint8_t> bytes, const std::string& name,
                 const ImageLimits& limits) {
  GifReader r(bytes, name);
  r.frame0(limits);
  return r.pixels();
}

}  // namespace deltafin::vision::detail
