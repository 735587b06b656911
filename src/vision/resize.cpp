// Pillow's BICUBIC resize in integers (resize.h; docs/VISION.md §3.4). The double-precision
// weight computation follows the doc's formulas operation by operation: this folder is compiled
// with -ffp-contract=off (src/CMakeLists.txt), so no multiply-add is fused where Pillow's build
// rounds twice, and the weights come out bit-identical.
#include "vision/resize.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace deltafin::vision {

namespace {

constexpr int kPrecisionBits = 22;

// Keys' cubic with a = -0.5, as the doc writes it.
double bicubic_kernel(double x) {
  const double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

uint8_t clip8(int64_t acc) {
  if (acc <= 0) return 0;
  if (acc >= (int64_t{1} << (kPrecisionBits + 8))) return 255;
  return static_cast<uint8_t>(acc >> kPrecisionBits);
}

// One pass along rows (horizontal: `in` is [rows][in_size][ch] → [rows][out_size][ch]).
std::vector<uint8_t> pass_horizontal(const uint8_t* in, int64_t rows, int64_t in_size,
                                     int64_t out_size, int ch) {
  const ResampleTaps t = bicubic_taps(in_size, out_size);
  std::vector<uint8_t> out(static_cast<size_t>(rows * out_size * ch));
  for (int64_t y = 0; y < rows; ++y) {
    const uint8_t* src = in + y * in_size * ch;
    uint8_t* dst = out.data() + y * out_size * ch;
    for (int64_t o = 0; o < out_size; ++o) {
      const int32_t* k = t.weights.data() + o * t.ksize;
      const uint8_t* s = src + t.start[o] * ch;
      for (int c = 0; c < ch; ++c) {
        int64_t acc = int64_t{1} << (kPrecisionBits - 1);
        for (int64_t i = 0; i < t.count[o]; ++i) acc += int64_t{s[i * ch + c]} * k[i];
        dst[o * ch + c] = clip8(acc);
      }
    }
  }
  return out;
}

// One pass along columns: `in` is [in_size][cols][ch] → [out_size][cols][ch].
std::vector<uint8_t> pass_vertical(const uint8_t* in, int64_t cols, int64_t in_size,
                                   int64_t out_size, int ch) {
  const ResampleTaps t = bicubic_taps(in_size, out_size);
  const int64_t row = cols * ch;
  std::vector<uint8_t> out(static_cast<size_t>(out_size * row));
  std::vector<int64_t> acc(static_cast<size_t>(row));
  for (int64_t o = 0; o < out_size; ++o) {
    std::fill(acc.begin(), acc.end(), int64_t{1} << (kPrecisionBits - 1));
    const int32_t* k = t.weights.data() + o * t.ksize;
    for (int64_t i = 0; i < t.count[o]; ++i) {
      const uint8_t* s = in + (t.start[o] + i) * row;
      const int64_t w = k[i];
      for (int64_t x = 0; x < row; ++x) acc[x] += int64_t{s[x]} * w;
    }
    uint8_t* dst = out.data() + o * row;
    for (int64_t x = 0; x < row; ++x) dst[x] = clip8(acc[x]);
  }
  return out;
}

// Horizontal pass (if the width changes) into an 8-bit intermediate, then vertical (if the
// height changes); the input is only read. The caller has checked that a size changes.
std::vector<uint8_t> resample(const uint8_t* px, int64_t w, int64_t h, int ch, int64_t new_w,
                              int64_t new_h) {
  std::vector<uint8_t> horizontal;
  const uint8_t* src = px;
  if (new_w != w) {
    horizontal = pass_horizontal(px, h, w, new_w, ch);
    src = horizontal.data();
  }
  if (new_h != h) return pass_vertical(src, new_w, h, new_h, ch);
  return horizontal;
}

// Pillow's nearest-neighbour source indices: a running double sum, truncated.
std::vector<int64_t> nearest_table(int64_t in_size, int64_t out_size) {
  const double a = static_cast<double>(in_size) / static_cast<double>(out_size);
  double pos = a * 0.5;
  std::vector<int64_t> idx(static_cast<size_t>(out_size));
  for (int64_t i = 0; i < out_size; ++i) {
    int64_t s = pos >= 0 ? static_cast<int64_t>(pos) : 0;
    idx[i] = std::min(s, in_size - 1);
    pos += a;
  }
  return idx;
}

uint8_t muldiv255(uint32_t v, uint32_t a) {
  const uint32_t t = v * a + 128;
  return static_cast<uint8_t>(((t >> 8) + t) >> 8);
}

}  // namespace

ResampleTaps bicubic_taps(int64_t in_size, int64_t out_size) {
  if (in_size <= 0 || out_size <= 0) fail("resize from {} to {} samples", in_size, out_size);
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filterscale = std::max(scale, 1.0);
  const double support = 2.0 * filterscale;
  ResampleTaps t;
  t.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.start.resize(static_cast<size_t>(out_size));
  t.count.resize(static_cast<size_t>(out_size));
  t.weights.assign(static_cast<size_t>(out_size * t.ksize), 0);
  const double ss = 1.0 / filterscale;
  std::vector<double> k(static_cast<size_t>(t.ksize));
  for (int64_t o = 0; o < out_size; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    int64_t xmin = static_cast<int64_t>(center - support + 0.5);  // C cast: toward zero
    if (xmin < 0) xmin = 0;
    int64_t xmax = static_cast<int64_t>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    const int64_t count = xmax - xmin;
    if (count < 0 || count > t.ksize)
      fail("bicubic taps: {} taps for a kernel of {}", count, t.ksize);
    double sum = 0.0;
    for (int64_t i = 0; i < count; ++i) {
      const double w = bicubic_kernel((static_cast<double>(i + xmin) - center + 0.5) * ss);
      k[i] = w;
      sum += w;
    }
    for (int64_t i = 0; i < count; ++i) {
      const double w = sum != 0.0 ? k[i] / sum : k[i];
      const double fixed = w * static_cast<double>(1 << kPrecisionBits);
      t.weights[o * t.ksize + i] =
          static_cast<int32_t>(w < 0 ? fixed - 0.5 : fixed + 0.5);  // C cast: toward zero
    }
    t.start[o] = xmin;
    t.count[o] = count;
  }
  return t;
}

Image resize_bicubic(const Image& im, int64_t new_w, int64_t new_h) {
  if (new_w <= 0 || new_h <= 0) fail("resize to {}x{}", new_w, new_h);
  if (new_w == im.width && new_h == im.height) return im;
  Image out;
  out.mode = im.mode;
  out.width = new_w;
  out.height = new_h;
  out.palette = im.palette;
  out.transparency = im.transparency;
  const int ch = im.channels();
  if (im.mode == PixelMode::kP || im.mode == PixelMode::k1) {
    const auto rows = nearest_table(im.height, new_h);
    const auto cols = nearest_table(im.width, new_w);
    out.pixels.resize(static_cast<size_t>(new_w * new_h));
    for (int64_t y = 0; y < new_h; ++y) {
      const uint8_t* src = im.pixels.data() + rows[y] * im.width;
      uint8_t* dst = out.pixels.data() + y * new_w;
      for (int64_t x = 0; x < new_w; ++x) dst[x] = src[cols[x]];
    }
    return out;
  }
  if (im.mode == PixelMode::kRGBA || im.mode == PixelMode::kLA) {
    // Premultiplied alpha around the resample; alpha itself is resampled like a colour band.
    std::vector<uint8_t> pre = im.pixels;
    const size_t n = static_cast<size_t>(im.width * im.height);
    for (size_t i = 0; i < n; ++i) {
      uint8_t* p = pre.data() + i * ch;
      const uint8_t a = p[ch - 1];
      for (int c = 0; c < ch - 1; ++c) p[c] = muldiv255(p[c], a);
    }
    out.pixels = resample(pre.data(), im.width, im.height, ch, new_w, new_h);
    pre = {};
    const size_t m = static_cast<size_t>(new_w * new_h);
    for (size_t i = 0; i < m; ++i) {
      uint8_t* p = out.pixels.data() + i * ch;
      const uint32_t a = p[ch - 1];
      if (a == 0 || a == 255) continue;
      for (int c = 0; c < ch - 1; ++c) p[c] = static_cast<uint8_t>(std::min(255u, 255u * p[c] / a));
    }
    return out;
  }
  out.pixels = resample(im.pixels.data(), im.width, im.height, ch, new_w, new_h);
  return out;
}

}  // namespace deltafin::vision
