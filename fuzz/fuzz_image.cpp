// Fuzz body for image files (the `image` target): any byte string through the format sniffing,
// the header probe and the decoders of all four formats (src/vision), then the processor's
// compositing and a Pillow resize of what decoded. Images come from clients, so every input must
// end in a decoded image or one deltafin::Error (InvalidArgument), never a crash, a longjmp gone
// wrong, or an allocation the header asked for beyond the limits.
//
// Invariants checked: a decoded image's buffer holds width × height × channels bytes and its
// palette 256 entries; the header probe agrees with the full decode on format, size and mode (a
// caller counts tokens from the probe alone); the decode stays within the (small) limits given.
#include <span>

#include "core/error.h"
#include "fuzz_targets.h"
#include "vision/image.h"
#include "vision/preprocess.h"
#include "vision/resize.h"

namespace deltafin::fuzz {

void image(const uint8_t* data, size_t size) {
  // Small limits keep each input fast; the limit checks themselves are what is being tested.
  vision::ImageLimits limits;
  limits.max_pixels = 1u << 20;
  limits.max_bytes = 1u << 20;
  const std::span<const uint8_t> bytes(data, size);
  vision::Image im;
  try {
    im = vision::decode_image(bytes, "fuzz-input", limits);
  } catch (const Error&) {
    return;
  }
  fuzz_check(im.width > 0 && im.height > 0, "a decoded image has no pixels");
  fuzz_check(
      static_cast<uint64_t>(im.width) * static_cast<uint64_t>(im.height) <= limits.max_pixels,
      "a decoded image exceeds the pixel limit");
  fuzz_check(im.pixels.size() == static_cast<size_t>(im.width * im.height * im.channels()),
             "a decoded image's buffer does not match its size and mode");
  fuzz_check(im.mode != vision::PixelMode::kP || im.palette.size() == 256 * 3,
             "a palette image without 256 palette entries");
  vision::ImageInfo info;
  try {
    info = vision::probe_image(bytes, "fuzz-input", limits);
  } catch (const Error&) {
    fuzz_check(false, "the header probe refused an image the decoder accepted");
  }
  fuzz_check(info.width == im.width && info.height == im.height && info.mode == im.mode,
             "the header probe disagrees with the decoder");
  const auto bg = vision::release_media_proc_config().background;
  const std::vector<uint8_t> rgb = vision::composite_rgb(im, bg);
  fuzz_check(rgb.size() == static_cast<size_t>(im.width * im.height * 3),
             "compositing changed the image size");
  const vision::Image half = vision::resize_bicubic(im, (im.width + 1) / 2, (im.height + 2) / 3);
  fuzz_check(half.pixels.size() == static_cast<size_t>(half.width * half.height * im.channels()),
             "a resized image's buffer does not match its size");
}

}  // namespace deltafin::fuzz
