// JPEG through libjpeg-turbo with the library's defaults, as Pillow decodes it on Debian 12
// (docs/VISION.md §3.1): islow IDCT, fancy upsampling of subsampled chroma, one component → "L",
// three → "RGB" (libjpeg converts YCbCr), four (CMYK/YCCK) refused by name. No EXIF orientation.
//
// Error handling: libjpeg's documented error-manager pattern — error_exit formats the message
// and longjmps to the setjmp of the calling phase. Each phase is a function that holds no C++
// object with a destructor and only calls libjpeg; the decompressor is owned by an RAII holder
// in the caller. A premature end of data, which libjpeg only warns about (filling the rest with
// grey), is an error here as it is in Pillow ("image file is truncated"). A progressive file is
// limited in scans (a scan bomb costs time per scan, not memory) through the progress monitor.
#include <csetjmp>
#include <cstdio>
#include <cstring>
// jpeglib.h needs size_t and FILE declared first.
#include <jerror.h>
#include <jpeglib.h>

#include "core/error.h"
#include "vision/decoders.h"

namespace deltafin::vision::detail {

namespace {

// Progressive JPEGs of real images have about 10 scans; libjpeg-turbo's own tools suggest
// refusing files with hundreds.
constexpr int kMaxScans = 500;

struct JpegErrorManager {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char text[JMSG_LENGTH_MAX];
};

struct JpegProgress {
  jpeg_progress_mgr pub;
};

void df_jpeg_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->text);
  std::longjmp(err->jump, 1);
}

void df_jpeg_emit_message(j_common_ptr cinfo, int level) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  if (level < 0) {
    if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
      std::snprintf(err->text, sizeof err->text, "%s", "the file ends early (truncated)");
      std::longjmp(err->jump, 1);
    }
    ++cinfo->err->num_warnings;  // other corrupt-data warnings: libjpeg goes on, as in Pillow
  }
}

void df_jpeg_progress(j_common_ptr cinfo) {
  if (cinfo->is_decompressor) {
    auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
    if (d->input_scan_number > kMaxScans) {
      auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
      std::snprintf(err->text, sizeof err->text, "more than %d scans", kMaxScans);
      std::longjmp(err->jump, 1);
    }
  }
}

// Phase 1: create the decompressor and read the header. No C++ object lives in this frame.
bool read_header(jpeg_decompress_struct* cinfo, JpegErrorManager* err, JpegProgress* progress,
                 bool* created, const uint8_t* data, size_t size) {
  if (setjmp(err->jump)) return false;
  cinfo->err = jpeg_std_error(&err->pub);
  err->pub.error_exit = df_jpeg_error_exit;
  err->pub.emit_message = df_jpeg_emit_message;
  jpeg_create_decompress(cinfo);
  *created = true;
  progress->pub.progress_monitor = df_jpeg_progress;
  cinfo->progress = &progress->pub;
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  return true;
}

// Phase 2: decompress every scanline into `out` (`stride` bytes per row). No C++ object here.
bool read_pixels(jpeg_decompress_struct* cinfo, JpegErrorManager* err, uint8_t* out, size_t stride,
                 int channels) {
  if (setjmp(err->jump)) return false;
  jpeg_start_decompress(cinfo);
  if (cinfo->output_width != cinfo->image_width || cinfo->output_height != cinfo->image_height ||
      cinfo->output_components != channels) {
    std::snprintf(err->text, sizeof err->text, "the decoder would give %ux%ux%d, expected %ux%ux%d",
                  cinfo->output_width, cinfo->output_height, cinfo->output_components,
                  cinfo->image_width, cinfo->image_height, channels);
    return false;
  }
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = out + stride * cinfo->output_scanline;
    if (jpeg_read_scanlines(cinfo, &row, 1) != 1) {
      std::snprintf(err->text, sizeof err->text, "%s", "no scanline returned");
      return false;
    }
  }
  return true;
}

class JpegReader {
 public:
  JpegReader(std::span<const uint8_t> bytes, const std::string& name) : name_(name) {
    std::memset(&cinfo_, 0, sizeof cinfo_);
    std::memset(&err_, 0, sizeof err_);
    std::memset(&progress_, 0, sizeof progress_);
    if (!read_header(&cinfo_, &err_, &progress_, &created_, bytes.data(), bytes.size())) {
      // A constructor that throws runs no destructor: release the decompressor here.
      if (created_) jpeg_destroy_decompress(&cinfo_);
      created_ = false;
      fail_arg("{}: not a valid JPEG ({})", name_, err_.text);
    }
  }
  ~JpegReader() {
    if (created_) jpeg_destroy_decompress(&cinfo_);
  }
  JpegReader(const JpegReader&) = delete;
  JpegReader& operator=(const JpegReader&) = delete;

  ImageInfo info(const ImageLimits& limits) {
    check_size(cinfo_.image_width, cinfo_.image_height, name_, "JPEG", limits);
    ImageInfo i;
    i.format = ImageFormat::kJpeg;
    i.width = cinfo_.image_width;
    i.height = cinfo_.image_height;
    if (cinfo_.num_components == 1) {
      i.mode = PixelMode::kL;
    } else if (cinfo_.num_components == 3) {
      i.mode = PixelMode::kRGB;
    } else if (cinfo_.num_components == 4) {
      fail_arg(
          "{}: CMYK JPEG (Pillow mode CMYK) is not supported; expected a greyscale or colour "
          "(YCbCr/RGB) JPEG (docs/VISION.md §3.1)",
          name_);
    } else {
      fail_arg("{}: JPEG with {} components; expected 1 (grey) or 3 (colour)", name_,
               cinfo_.num_components);
    }
    return i;
  }

  std::vector<uint8_t> pixels(PixelMode mode) {
    cinfo_.out_color_space = mode == PixelMode::kL ? JCS_GRAYSCALE : JCS_RGB;
    const int channels = mode == PixelMode::kL ? 1 : 3;
    const size_t stride = static_cast<size_t>(cinfo_.image_width) * channels;
    std::vector<uint8_t> out(stride * cinfo_.image_height);
    if (!read_pixels(&cinfo_, &err_, out.data(), stride, channels))
      fail_arg("{}: the JPEG image data cannot be decoded ({})", name_, err_.text);
    return out;
  }

 private:
  std::string name_;
  jpeg_decompress_struct cinfo_;
  JpegErrorManager err_;
  JpegProgress progress_;
  bool created_ = false;
};

}  // namespace

ImageInfo probe_jpeg(std::span<const uint8_t> bytes, const std::string& name,
                     const ImageLimits& limits) {
  JpegReader r(bytes, name);
  return r.info(limits);
}

Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& name,
                  const ImageLimits& limits) {
  JpegReader r(bytes, name);
  const ImageInfo info = r.info(limits);
  Image im;
  im.mode = info.mode;
  im.width = info.width;
  im.height = info.height;
  im.pixels = r.pixels(info.mode);
  return im;
}

}  // namespace deltafin::vision::detail
