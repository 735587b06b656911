// The backend (gpu.h): what goes to the device and how it is cut to fit. A product is split
// along W's rows into pieces whose bytes fit one storage buffer, and along x's rows so that an
// x block and its y block fit too; each piece is one dispatch writing its columns of a dense y
// block, which is then copied out to the caller's y (adding when accumulating, as the CPU
// kernels do: y + sum). Weights come from the resident set (keyed by their address, valid for
// the backend's life), else are imported zero-copy (unified memory) or uploaded into reused
// scratch buffers for this product. Grouped products (the routed experts) always copy, in
// batches pipelined over two buffer sets (grouped_product). Calls are serialised by one mutex.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include "core/error.h"
#include "gpu/device.h"

namespace deltafin::gpu {

namespace {

constexpr uint32_t kMaxTm = 16;  // matmul.comp: x rows per workgroup at most

const char* module_for(WeightFormat f, bool grouped) {
  switch (f) {
    case WeightFormat::kF32:
      return grouped ? "grouped_f32" : "matmul_f32";
    case WeightFormat::kBF16:
      return grouped ? "grouped_bf16" : "matmul_bf16";
    case WeightFormat::kMXFP4:
      return grouped ? "grouped_mxfp4" : "matmul_mxfp4";
    case WeightFormat::kFP8:
      return grouped ? "grouped_fp8" : "matmul_fp8";
    case WeightFormat::kInt4:
      return grouped ? "grouped_int4" : "matmul_int4";
    default:
      return nullptr;
  }
}

bool supported(const Matrix& w) {
  if (module_for(w.format, false) == nullptr || !w.valid()) return false;
  if (w.format == WeightFormat::kMXFP4 && (w.cols % 32 != 0 || w.scales == nullptr)) return false;
  if ((w.format == WeightFormat::kFP8 || w.format == WeightFormat::kInt4) && w.scales == nullptr)
    return false;
  // f32 rows are read as whole words
  if (w.format == WeightFormat::kF32 && reinterpret_cast<uintptr_t>(w.data) % 4 != 0) return false;
  return true;
}

// A run of W's rows in device memory: data (and scales) at byte offsets in their buffers.
struct Piece {
  int64_t row0 = 0, rows = 0;
  std::shared_ptr<Buffer> data, scales;
  uint64_t data_off = 0, scales_off = 0;
};

// Pieces of `w` whose bytes fit one binding (less a page for an import's alignment).
std::vector<Piece> cut(const Matrix& w, uint64_t range) {
  const uint64_t per_row = static_cast<uint64_t>(std::max<int64_t>(w.row_bytes(), 1));
  const uint64_t usable = range - std::min<uint64_t>(range / 2, 65536);  // an import's alignment
  const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(usable / per_row));
  std::vector<Piece> out;
  for (int64_t r = 0; r < w.rows; r += step) {
    Piece p;
    p.row0 = r;
    p.rows = std::min(step, w.rows - r);
    out.push_back(p);
  }
  return out;
}

uint64_t round_up16(uint64_t b) {
  return (b + 15) & ~uint64_t{15};
}

// Whether the format has a scale buffer (binding 1).
bool scaled_format(WeightFormat f) {
  return f == WeightFormat::kMXFP4 || f == WeightFormat::kFP8 || f == WeightFormat::kInt4;
}

// Puts the bytes of `w`'s pieces on the device: imported (zero-copy) when the device shares
// host memory and the driver allows, else copied into `slots` (reused buffers, grown as needed)
// or, when `slots` is null, into buffers of their own (resident weights).
void place(Device& dev, const Matrix& w, std::vector<Piece>& pieces,
           std::vector<std::shared_ptr<Buffer>>* slots, Stats& stats) {
  const bool scaled = scaled_format(w.format);
  for (size_t i = 0; i < pieces.size(); ++i) {
    Piece& p = pieces[i];
    const Matrix sub = w.row_slice(p.row0, p.row0 + p.rows);
    const uint64_t db = static_cast<uint64_t>(sub.rows * sub.row_bytes());
    const uint64_t sb = scaled ? static_cast<uint64_t>(sub.scale_bytes()) : 0;
    if (dev.info().unified && dev.info().host_import) {
      p.data = dev.import(sub.data, db, p.data_off);
      if (p.data && scaled) p.scales = dev.import(sub.scales, sb, p.scales_off);
      if (p.data && (!scaled || p.scales)) {
        stats.imported_bytes += db + sb;
        continue;
      }
    }
    auto get = [&](size_t slot, uint64_t bytes) {
      bytes = round_up16(bytes);
      if (slots == nullptr) return dev.alloc(bytes);
      if (slots->size() <= slot) slots->resize(slot + 1);
      std::shared_ptr<Buffer>& b = (*slots)[slot];
      if (!b || buffer_size(*b) < bytes) {
        b.reset();
        b = dev.alloc(bytes);
      }
      return b;
    };
    p.data = get(2 * i, db);
    p.data_off = 0;
    dev.upload(*p.data, 0, sub.data, db);
    if (scaled) {
      p.scales = get(2 * i + 1, sb);
      p.scales_off = 0;
      dev.upload(*p.scales, 0, sub.scales, sb);
    }
    stats.uploaded_bytes += db + sb;
  }
}

// A buffer of at least `bytes`, reused while big enough.
Buffer& grow(Device& dev, std::shared_ptr<Buffer>& b, uint64_t bytes) {
  bytes = round_up16(bytes);
  if (!b || buffer_size(*b) < bytes) {
    b.reset();
    b = dev.alloc(bytes);  // device-local; filled and read through staging where not mapped
  }
  return *b;
}

// Workgroup counts for N output rows (x: up to max_x, z: the rest) and `tiles` row tiles.
void set_groups(Dispatch& d, int64_t N, int64_t tiles, uint32_t max_x) {
  const uint32_t gx = static_cast<uint32_t>(std::min<int64_t>(N, std::min<uint32_t>(max_x, 32768)));
  d.groups[0] = gx;
  d.groups[1] = static_cast<uint32_t>(tiles);
  d.groups[2] = static_cast<uint32_t>((N + gx - 1) / gx);
}

}  // namespace

struct Backend::State {
  uint64_t range = 0;  // bytes one binding may cover
  std::mutex mu;
  std::map<const void*, std::vector<Piece>> resident;  // by W's data pointer
  std::map<const void*, Matrix> resident_shape;
  uint64_t resident_bytes = 0;
  uint64_t budget = 0;
  std::vector<std::shared_ptr<Buffer>> scratch;  // per piece: W data, scales
  std::shared_ptr<Buffer> xbuf, ybuf;
  struct GroupSlot {  // one of the two buffer sets of grouped products
    std::shared_ptr<Buffer> w, s, x, y, tiles, rows;
  };
  GroupSlot group_slots[2];
  bool failed = false;
  Stats stats;
};

namespace {
// The resident pieces of exactly this matrix (a row slice shares its data pointer: no match).
const std::vector<Piece>* find_resident(const Backend::State& s, const Matrix& w) {
  auto it = s.resident_shape.find(w.data);
  if (it == s.resident_shape.end()) return nullptr;
  const Matrix& r = it->second;
  if (r.rows != w.rows || r.cols != w.cols || r.format != w.format || r.scales != w.scales ||
      r.row_phase != w.row_phase)
    return nullptr;
  return &s.resident.at(w.data);
}
}  // namespace

Backend::Backend(Options o, std::unique_ptr<Device> d)
    : options_(std::move(o)), device_(std::move(d)), state_(std::make_unique<State>()) {
  const uint64_t heap = device_->info().device_local_bytes;
  if (options_.memory > heap) {
    fail_setting("gpu memory", fmt::format("{} MiB", options_.memory >> 20),
                 "more than the device has ({} MiB of device memory on {})", heap >> 20,
                 device_->info().describe());
  }
  state_->budget = options_.memory != 0 ? options_.memory : heap / 4 * 3;
  state_->range = device_->max_range();
  if (options_.max_buffer != 0) state_->range = std::min(state_->range, options_.max_buffer);
}

uint64_t Backend::range_limit() const {
  return state_->range;
}

Backend::~Backend() {
  state_.reset();  // buffers before the device
}

const DeviceInfo& Backend::info() const {
  return device_->info();
}

std::unique_ptr<Backend> Backend::open(const Options& o, std::string& line) {
  if (o.select == "off" || o.select.empty()) {
    line = "[gpu] off: everything runs on the CPU";
    return nullptr;
  }
  if (!compiled_in()) {
    if (o.select == "auto") {
      line =
          "[gpu] auto: this build has no Vulkan backend (configured without libvulkan-dev and "
          "glslc); running on the CPU";
      return nullptr;
    }
    fail_setting("gpu", o.select,
                 "this build has no Vulkan backend (rebuild with Debian libvulkan-dev and glslc "
                 "installed)");
  }
  Probe p = probe();
  int index = -1;
  if (o.select == "auto") {
    // A real GPU only, best kind first; CPU devices (lavapipe) only when named by index.
    for (const char* kind : {"discrete", "integrated", "virtual"}) {
      for (const DeviceInfo& d : p.devices) {
        if (index < 0 && d.type == kind) index = d.index;
      }
    }
    if (index < 0) {
      std::string seen;
      for (const DeviceInfo& d : p.devices)
        seen += fmt::format("{}{} {} ({})", seen.empty() ? "" : ", ", d.index, d.name, d.type);
      line =
          fmt::format("[gpu] auto: no Vulkan GPU found ({}); running on the CPU",
                      p.devices.empty() ? p.error : "devices: " + seen + "; name one by its index");
      return nullptr;
    }
  } else {
    char* end = nullptr;
    long v = std::strtol(o.select.c_str(), &end, 10);
    if (end == o.select.c_str() || *end != '\0' || v < 0)
      fail_setting("gpu", o.select, "expected auto, off or a device index (0, 1, ...)");
    if (p.devices.empty()) fail_setting("gpu", o.select, "no Vulkan device: {}", p.error);
    if (v >= static_cast<long>(p.devices.size()))
      fail_setting("gpu", o.select, "no such Vulkan device (this machine has {}: 0..{})",
                   p.devices.size(), p.devices.size() - 1);
    index = static_cast<int>(v);
  }
  std::unique_ptr<Backend> b(new Backend(o, Device::open(index, o.staged)));
  line = fmt::format(
      "[gpu] using Vulkan device {}; {} MiB for resident weights; products of "
      ">= {} rows upload their weights",
      b->info().describe(), b->budget_bytes() >> 20, o.min_rows);
  return b;
}

uint64_t Backend::resident_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->resident_bytes;
}
uint64_t Backend::budget_bytes() const {
  return state_->budget;
}
bool Backend::failed() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->failed;
}
Stats Backend::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats;
}

bool Backend::make_resident(const Matrix& w) {
  if (!supported(w)) return false;
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.failed) return false;
  if (find_resident(s, w) != nullptr) return true;
  if (s.resident.count(w.data)) return false;  // another view of these bytes is resident
  const uint64_t bytes = static_cast<uint64_t>(w.bytes());
  const bool zero_copy = device_->info().unified && device_->info().host_import;
  if (!zero_copy && s.resident_bytes + bytes > s.budget) return false;
  std::vector<Piece> pieces = cut(w, range_limit());
  Stats ignored;
  try {
    place(*device_, w, pieces, nullptr, ignored);
  } catch (const std::exception&) {
    return false;  // out of device memory: this matrix stays with the CPU or per-pass uploads
  }
  s.resident_bytes += ignored.uploaded_bytes;  // imported weights take no device memory
  s.resident[w.data] = std::move(pieces);
  s.resident_shape[w.data] = w;
  return true;
}

bool Backend::matmul(const Matrix& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy,
                     bool accumulate) {
  if (!supported(w) || M <= 0) return false;
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    const bool resident = find_resident(s, w) != nullptr;
    if (s.failed || (!resident && M < options_.min_rows)) {
      ++s.stats.declined;
      return false;
    }
  }
  std::vector<float> out;
  try {
    out = product(w, x, M, ldx);
  } catch (const std::exception& e) {
    note_failure(e);
    return false;
  }
  for (int64_t m = 0; m < M; ++m) {
    const float* src = out.data() + m * w.rows;
    float* dst = y + m * ldy;
    if (accumulate) {
      for (int64_t n = 0; n < w.rows; ++n) dst[n] = dst[n] + src[n];
    } else {
      std::memcpy(dst, src, static_cast<size_t>(w.rows) * sizeof(float));
    }
  }
  return true;
}

void Backend::note_failure(const std::exception& e) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.failed) {
    fmt::print(stderr, "[gpu] device error: {}; the CPU computes everything from here on\n",
               e.what());
    s.failed = true;
  }
  ++s.stats.declined;
}

void Backend::run(const Matrix& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy,
                  bool accumulate) {
  if (!supported(w))
    fail("the GPU backend does not run {} weights of {}x{}", weight_format_name(w.format), w.rows,
         w.cols);
  std::vector<float> out = product(w, x, M, ldx);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < w.rows; ++n)
      y[m * ldy + n] =
          (accumulate ? y[m * ldy + n] : 0.0f) + out[static_cast<size_t>(m * w.rows + n)];
}

// The dense product [M][N] on the device (throws Error on a device error).
std::vector<float> Backend::product(const Matrix& w, const float* x, int64_t M, int64_t ldx) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  const auto t0 = std::chrono::steady_clock::now();
  Device& dev = *device_;
  const int64_t N = w.rows, K = w.cols;
  const uint64_t range = range_limit();
  // x and y blocks within one binding
  const int64_t mc_max =
      std::min<int64_t>(M, static_cast<int64_t>(std::min(range / static_cast<uint64_t>(K * 4),
                                                         range / static_cast<uint64_t>(N * 4))));
  if (mc_max < 1)
    fail("a {}x{} product does not fit the device's {} MiB buffers", N, K, range >> 20);
  std::vector<Piece> transient;
  const std::vector<Piece>* pieces = nullptr;
  if (const std::vector<Piece>* r = find_resident(s, w)) {
    pieces = r;
  } else {
    transient = cut(w, range);
    place(dev, w, transient, &s.scratch, s.stats);
    pieces = &transient;
  }
  const char* module = module_for(w.format, false);
  std::vector<float> out(static_cast<size_t>(M * N));
  std::vector<float> xb;
  for (int64_t m0 = 0; m0 < M; m0 += mc_max) {
    const int64_t mc = std::min(mc_max, M - m0);
    Buffer& xbuf = grow(dev, s.xbuf, static_cast<uint64_t>(mc * K * 4));
    Buffer& ybuf = grow(dev, s.ybuf, static_cast<uint64_t>(mc * N * 4));
    xb.resize(static_cast<size_t>(mc * K));
    for (int64_t m = 0; m < mc; ++m)
      std::memcpy(xb.data() + m * K, x + (m0 + m) * ldx, static_cast<size_t>(K) * 4);
    dev.upload(xbuf, 0, xb.data(), xb.size() * 4);
    const uint32_t tm = mc >= 4 ? kMaxTm : 1;
    std::vector<Dispatch> ds;
    for (const Piece& p : *pieces) {
      Dispatch d;
      d.module = module;
      d.tm = tm;
      d.buffers[0] = p.data.get();
      d.buffers[1] = p.scales.get();
      d.buffers[2] = &xbuf;
      d.buffers[3] = &ybuf;
      d.push[0] = static_cast<uint32_t>(p.rows);
      d.push[1] = static_cast<uint32_t>(K);
      d.push[2] = static_cast<uint32_t>(mc);
      d.push[3] = static_cast<uint32_t>(p.data_off);
      d.push[4] = static_cast<uint32_t>(p.scales_off);
      d.push[5] = static_cast<uint32_t>(K);
      d.push[6] = static_cast<uint32_t>(N);
      d.push[7] = static_cast<uint32_t>(p.row0);
      d.push[10] = static_cast<uint32_t>(w.row_slice(p.row0, p.row0 + p.rows).row_phase);
      set_groups(d, p.rows, (mc + tm - 1) / tm, dev.max_groups_x());
      ds.push_back(d);
    }
    dev.run(ds);
    dev.download(ybuf, 0, out.data() + m0 * N, static_cast<uint64_t>(mc * N * 4));
  }
  s.stats.products += 1;
  s.stats.rows += M;
  s.stats.flops += 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  s.stats.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

namespace {
// Whether every group's W is one supported shape and format.
bool groupable(std::span<const Group> groups) {
  const Matrix& w0 = groups[0].w;
  for (const Group& g : groups) {
    if (!supported(g.w) || g.w.rows != w0.rows || g.w.cols != w0.cols || g.w.format != w0.format ||
        (g.w.scales == nullptr) != (w0.scales == nullptr) || g.w.row_phase != w0.row_phase)
      return false;
  }
  return true;
}
}  // namespace

void Backend::run_grouped(std::span<const Group> groups, const float* x, int64_t ldx, float* y) {
  if (groups.empty()) return;
  if (!groupable(groups))
    fail("a grouped product needs supported weights of one shape and format ({} {}x{})",
         weight_format_name(groups[0].w.format), groups[0].w.rows, groups[0].w.cols);
  grouped_product(groups, x, ldx, y);
}

bool Backend::takes_grouped(int64_t pass_rows) const {
  return pass_rows >= options_.min_rows && !failed();
}

bool Backend::grouped(std::span<const Group> groups, const float* x, int64_t ldx, float* y) {
  if (groups.empty()) return true;
  State& s = *state_;
  if (!groupable(groups) || failed()) {
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.stats.declined;
    return false;
  }
  try {
    grouped_product(groups, x, ldx, y);
  } catch (const std::exception& e) {
    note_failure(e);
    return false;
  }
  return true;
}

// The pipeline of one grouped product: batch b fills buffer set b % 2 (weights, x rows, tile
// and row lists) and is submitted without waiting; before set b % 2 is filled again its earlier
// batch is waited for and its y read back. So the copy of batch b + 1's weights (a memcpy into
// mapped memory, or into the staging buffer) runs while the device computes batch b.
void Backend::grouped_product(std::span<const Group> groups, const float* x, int64_t ldx,
                              float* y) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.failed) fail("the device failed earlier");
  const auto t0 = std::chrono::steady_clock::now();
  Device& dev = *device_;
  const Matrix& w0 = groups[0].w;
  const int64_t N = w0.rows, K = w0.cols;
  const uint64_t range = range_limit();
  const bool scaled = scaled_format(w0.format);
  const uint64_t wb = round_up16(static_cast<uint64_t>(N * w0.row_bytes()));
  const uint64_t sb = scaled ? round_up16(static_cast<uint64_t>(w0.scale_bytes())) : 0;
  if (wb > range) fail("one expert's {}x{} weights exceed a device buffer", N, K);
  const int64_t max_rows = static_cast<int64_t>(
      std::min(range / static_cast<uint64_t>(K * 4), range / static_cast<uint64_t>(N * 4)));
  if (max_rows < 1) fail("a {}x{} grouped product does not fit the device's buffers", N, K);
  // Groups with rows, a group cut where its rows exceed one buffer (its W is then uploaded once
  // per cut); the output rows of each part follow one another as the groups' do.
  std::vector<Group> parts;
  for (const Group& g : groups) {
    const auto n = static_cast<int64_t>(g.rows.size());
    for (int64_t i = 0; i < n; i += max_rows)
      parts.push_back({g.w, g.rows.subspan(static_cast<size_t>(i),
                                           static_cast<size_t>(std::min(max_rows, n - i)))});
  }
  // Batches of consecutive parts: weights within one buffer and at most about a quarter of the
  // product's (so that uploads overlap compute), rows within the x and y buffers.
  const uint64_t quarter = (parts.size() + 3) / 4;
  const uint64_t per_batch = std::max<uint64_t>(1, std::min<uint64_t>(range / wb, quarter));
  struct Batch {
    size_t first = 0, end = 0;
    int64_t out_row = 0, rows = 0;
  };
  std::vector<Batch> batches;
  int64_t out_row = 0;
  for (size_t p = 0; p < parts.size();) {
    Batch b{p, p, out_row, 0};
    while (b.end < parts.size() && b.end - b.first < per_batch &&
           b.rows + static_cast<int64_t>(parts[b.end].rows.size()) <= max_rows) {
      b.rows += static_cast<int64_t>(parts[b.end].rows.size());
      ++b.end;
    }
    batches.push_back(b);
    out_row += b.rows;
    p = b.end;
  }
  struct InFlight {
    uint64_t ticket = 0;
    const Batch* batch = nullptr;
  };
  InFlight flight[2];
  auto land = [&](int slot) {  // waits for the slot's batch and reads its y back
    InFlight& f = flight[slot];
    if (f.batch == nullptr) return;
    dev.wait(f.ticket);
    dev.download(*s.group_slots[slot].y, 0, y + f.batch->out_row * N,
                 static_cast<uint64_t>(f.batch->rows * N * 4));
    f.batch = nullptr;
  };
  try {
    std::vector<uint32_t> tiles, xrows;
    std::vector<float> xb;
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      const Batch& b = batches[bi];
      const int slot = static_cast<int>(bi % 2);
      land(slot);
      const bool overlapped = flight[1 - slot].batch != nullptr;
      State::GroupSlot& gs = s.group_slots[slot];
      const uint64_t experts = b.end - b.first;
      Buffer& wbuf = grow(dev, gs.w, experts * wb);
      Buffer& sbuf = grow(dev, gs.s, std::max<uint64_t>(experts * sb, 16));
      tiles.clear();
      xrows.clear();
      xb.clear();
      uint64_t bytes = 0;
      for (size_t g = b.first; g < b.end; ++g) {
        const Matrix& w = parts[g].w;
        const uint64_t e = g - b.first;
        dev.upload(wbuf, e * wb, w.data, static_cast<uint64_t>(N * w.row_bytes()));
        if (scaled) dev.upload(sbuf, e * sb, w.scales, static_cast<uint64_t>(w.scale_bytes()));
        bytes += static_cast<uint64_t>(w.bytes());
        const auto n = static_cast<int64_t>(parts[g].rows.size());
        for (int64_t i = 0; i < n; i += kMaxTm) {
          tiles.push_back(static_cast<uint32_t>(e));
          tiles.push_back(static_cast<uint32_t>(xrows.size() + static_cast<size_t>(i)));
          tiles.push_back(static_cast<uint32_t>(std::min<int64_t>(kMaxTm, n - i)));
        }
        for (int32_t r : parts[g].rows) {
          xrows.push_back(static_cast<uint32_t>(xb.size() / static_cast<size_t>(K)));
          xb.insert(xb.end(), x + r * ldx, x + r * ldx + K);
        }
      }
      s.stats.uploaded_bytes += bytes;
      s.stats.expert_bytes += bytes;
      if (overlapped) s.stats.overlapped_bytes += bytes;
      Buffer& xbuf = grow(dev, gs.x, xb.size() * 4);
      Buffer& ybuf = grow(dev, gs.y, static_cast<uint64_t>(b.rows * N * 4));
      Buffer& tbuf = grow(dev, gs.tiles, tiles.size() * 4);
      Buffer& rbuf = grow(dev, gs.rows, xrows.size() * 4);
      dev.upload(xbuf, 0, xb.data(), xb.size() * 4);
      dev.upload(tbuf, 0, tiles.data(), tiles.size() * 4);
      dev.upload(rbuf, 0, xrows.data(), xrows.size() * 4);
      Dispatch d;
      d.module = module_for(w0.format, true);
      d.tm = kMaxTm;
      d.buffers[0] = &wbuf;
      d.buffers[1] = &sbuf;
      d.buffers[2] = &xbuf;
      d.buffers[3] = &ybuf;
      d.buffers[4] = &tbuf;
      d.buffers[5] = &rbuf;
      d.push[0] = static_cast<uint32_t>(N);
      d.push[1] = static_cast<uint32_t>(K);
      d.push[5] = static_cast<uint32_t>(K);
      d.push[6] = static_cast<uint32_t>(N);
      d.push[8] = static_cast<uint32_t>(wb);
      d.push[9] = static_cast<uint32_t>(sb);
      d.push[10] = static_cast<uint32_t>(w0.row_phase);
      set_groups(d, N, static_cast<int64_t>(tiles.size() / 3), dev.max_groups_x());
      flight[slot] = {dev.submit(std::span<const Dispatch>(&d, 1)), &b};
      s.stats.products += 1;
      s.stats.rows += b.rows;
      s.stats.flops += 2.0 * static_cast<double>(b.rows) * static_cast<double>(N * K);
    }
    land(static_cast<int>(batches.size() % 2));  // the older of the last two first
    land(static_cast<int>((batches.size() + 1) % 2));
  } catch (...) {
    for (InFlight& f : flight) {  // nothing may still read the buffers when they go
      try {
        if (f.batch != nullptr) dev.wait(f.ticket);
      } catch (...) {
      }
    }
    throw;
  }
  s.stats.grouped_products += 1;
  s.stats.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace deltafin::gpu
