#include "storage/streaming_trunk.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/file_io.h"
#include "core/timer.h"
#include "core/trace.h"
#include "core/weight_buffer.h"
#include "storage/checkpoint.h"
#include "storage/trunk_units.h"

namespace deltafin {

namespace {
constexpr uint64_t kChunk = 8ull << 20;  // one reader task

// Finds a tensor of a unit read into `mem` (names, infos and offsets in the same order).
TensorLookup lookup_in(const std::vector<std::string>& names,
                       const std::vector<const TensorInfo*>& infos,
                       const std::vector<uint64_t>& offsets, const uint8_t* mem) {
  return [&names, &infos, &offsets,
          mem](const std::string& name) -> std::pair<const TensorInfo*, const uint8_t*> {
    for (size_t k = 0; k < names.size(); ++k) {
      if (names[k] == name) return {infos[k], mem + offsets[k]};
    }
    fail("internal: tensor {} was not read", name);
  };
}
}  // namespace

StreamingTrunk::StreamingTrunk(const ModelConfig& c, const Checkpoint& ck, const MemoryPlan& plan,
                               int readers, bool direct_io, std::shared_ptr<ReadGate> gate)
    : c_(c), ck_(ck), plan_(plan), files_(ck, direct_io), pool_(readers, std::move(gate)) {
  embed_info_ = &ck.get(c.names.embed());
  if (embed_info_->dtype != DType::kBF16) fail("{}: the embedding must be BF16", embed_info_->name);
  for (int u = 0; u <= c.num_layers; ++u) layouts_.push_back(layout_for(u));
  read_resident_units();
  if (plan_.prefetch) read_routers();
  if (plan_.stream_buffer_bytes > 0) make_stream_buffers();
}

StreamingTrunk::~StreamingTrunk() {
  pool_.stop();  // in-flight reads land before the buffers go
  for (auto& b : buffers_) std::free(b->mem);
}

// Resident units: read once (all of them together), bind, quantise if asked.
void StreamingTrunk::read_resident_units() {
  const int L = static_cast<int>(c_.num_layers);
  resident_layers_.resize(static_cast<size_t>(L));
  std::vector<Completion> comps(layouts_.size());
  std::vector<uint8_t*> mems(layouts_.size(), nullptr);
  {
    std::lock_guard<std::mutex> l(mu_);
    for (int u = 0; u <= L; ++u) {
      if (!plan_.resident[static_cast<size_t>(u)]) continue;
      mems[u] = alloc_weight_buffer(layouts_[u].buf_bytes, "trunk weights");
      submit_locked(layouts_[u], mems[u], comps[u], u, ReaderPool::Priority::kDemand);
    }
  }
  std::string first_error;
  for (int u = 0; u <= L; ++u) {
    if (mems[u] == nullptr) continue;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return comps[u].pending == 0; });
    }
    if (!comps[u].error.empty()) {
      if (first_error.empty()) first_error = comps[u].error;
      std::free(mems[u]);
      continue;
    }
    bind_unit(u, mems[u], u < L ? &resident_layers_[u] : nullptr,
              u == L ? &resident_head_ : nullptr);
    if (plan_.trunk == TrunkFormat::kInt8) {
      // Every matrix now points into the int8 copies (small vectors were copied at bind).
      if (u < L) {
        quantize_layer_int8(resident_layers_[u], int8_store_);
      } else {
        quantize_head_int8(resident_head_, int8_store_);
      }
      std::free(mems[u]);
    } else {
      resident_mem_.emplace_back(mems[u], std::free);
    }
  }
  if (!first_error.empty()) fail_io("{}", first_error);
}

// The router roster for prefetch prediction: small buffered reads, whose pages are dropped
// again so the budget does not lean on the page cache.
void StreamingTrunk::read_routers() {
  const int L = static_cast<int>(c_.num_layers);
  routers_.resize(static_cast<size_t>(L));
  router_mem_.resize(static_cast<size_t>(L));
  for (int i = static_cast<int>(c_.first_k_dense); i < L; ++i) {
    const auto names = router_tensors(c_, i);
    std::vector<const TensorInfo*> infos;
    std::vector<uint64_t> offsets;
    uint64_t total = 0;
    for (const auto& n : names) {
      infos.push_back(&ck_.get(n));
      offsets.push_back(total);
      total += infos.back()->nbytes;
    }
    auto& mem = router_mem_[static_cast<size_t>(i)];
    mem.resize(total);
    for (size_t k = 0; k < names.size(); ++k)
      files_.read_buffered(infos[k]->shard, infos[k]->offset, infos[k]->nbytes,
                           mem.data() + offsets[k], names[k]);
    routers_[static_cast<size_t>(i)] =
        bind_router(c_, i, lookup_in(names, infos, offsets, mem.data()));
  }
  files_.drop_buffered_pages();
}

void StreamingTrunk::make_stream_buffers() {
  uint64_t need = 0;
  for (size_t u = 0; u < layouts_.size(); ++u) {
    if (!plan_.resident[u]) need = std::max(need, layouts_[u].buf_bytes);
  }
  const int count = std::max(2, plan_.stream_buffers);
  for (int i = 0; i < count; ++i) {
    buffers_.push_back(std::make_unique<Buffer>());
    buffers_.back()->mem = alloc_weight_buffer(need, "trunk weights");
  }
  std::lock_guard<std::mutex> l(mu_);
  cursor_ = static_cast<int>(c_.num_layers);  // so the first pass's first units come next
  top_up_locked();
}

StreamingTrunk::UnitLayout StreamingTrunk::layout_for(int unit) const {
  UnitLayout l;
  l.names = unit < c_.num_layers ? layer_trunk_tensors(c_, unit, ck_) : head_tensors(c_);
  for (const auto& n : l.names) l.infos.push_back(&ck_.get(n));
  // Coalesce tensors that sit (nearly) back to back in one shard into one aligned span.
  std::vector<size_t> order(l.infos.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::make_pair(l.infos[a]->shard, l.infos[a]->offset) <
           std::make_pair(l.infos[b]->shard, l.infos[b]->offset);
  });
  l.tensor_buf_offset.assign(l.infos.size(), 0);
  uint64_t buf = 0;
  size_t i = 0;
  while (i < order.size()) {
    const TensorInfo* first = l.infos[order[i]];
    uint64_t start = first->offset, end = first->offset + first->nbytes;
    size_t j = i + 1;
    while (j < order.size() && l.infos[order[j]]->shard == first->shard &&
           l.infos[order[j]]->offset <= end + kIoAlign) {
      end = std::max(end, l.infos[order[j]]->offset + l.infos[order[j]]->nbytes);
      ++j;
    }
    Span s{first->shard, io_align_down(start), io_align_up(end) - io_align_down(start), buf};
    for (size_t k = i; k < j; ++k)
      l.tensor_buf_offset[order[k]] = buf + (l.infos[order[k]]->offset - s.file_offset);
    l.spans.push_back(s);
    buf += s.length;
    l.file_bytes += end - start;
    i = j;
  }
  l.buf_bytes = buf;
  return l;
}

void StreamingTrunk::submit_locked(const UnitLayout& l, uint8_t* mem, Completion& done, int unit,
                                   ReaderPool::Priority p) {
  done.error.clear();
  for (const Span& s : l.spans) {
    for (uint64_t off = 0; off < s.length; off += kChunk) {
      const Span part{s.shard, s.file_offset + off, std::min(kChunk, s.length - off),
                      s.buf_offset + off};
      done.pending++;
      pool_.submit(p, [this, mem, part, &done, unit] {
        // The trunk is read from the model folder: drive 0, as the expert reads number it.
        TraceSpan span("trunk read", "io",
                       {{"bytes", part.length},
                        {"shard", part.shard},
                        {"drive", 0},
                        {"unit", unit},
                        {"queued_us", ReaderPool::current_queued_us()},
                        {"in_flight", ReaderPool::current_in_flight()}});
        // The tail past the end of the file is padding from the 4 KiB widening.
        const uint64_t size = files_.size(part.shard);
        const uint64_t need =
            std::min(part.length, size > part.file_offset ? size - part.file_offset : 0);
        std::string err;
        try {
          files_.read_aligned(part.shard, part.file_offset, part.length, mem + part.buf_offset,
                              need, "trunk weights");
        } catch (const std::exception& e) {
          err = e.what();
        }
        std::lock_guard<std::mutex> l(mu_);
        if (!err.empty() && done.error.empty()) done.error = err;
        if (--done.pending == 0) cv_.notify_all();
      });
    }
  }
}

void StreamingTrunk::bind_unit(int unit, const uint8_t* mem, LayerWeights* lw, HeadWeights* hw) {
  const UnitLayout& l = layouts_[static_cast<size_t>(unit)];
  const TensorLookup lookup = lookup_in(l.names, l.infos, l.tensor_buf_offset, mem);
  if (lw != nullptr) *lw = bind_layer(c_, unit, lookup);
  if (hw != nullptr) *hw = bind_head(c_, lookup);
}

int StreamingTrunk::next_streamed(int unit) const {
  const int n = static_cast<int>(layouts_.size());
  for (int k = 1; k <= n; ++k) {
    int u = (unit + k) % n;
    if (!plan_.resident[static_cast<size_t>(u)]) return u;
  }
  return -1;
}

void StreamingTrunk::start_locked(Buffer& b, int unit, ReaderPool::Priority p) {
  b.unit = unit;
  b.bound = false;
  submit_locked(layouts_[static_cast<size_t>(unit)], b.mem, b.done, unit, p);
  stats_.bytes_streamed += layouts_[static_cast<size_t>(unit)].file_bytes;
}

int StreamingTrunk::find_locked(int unit) const {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (buffers_[i]->unit == unit) return static_cast<int>(i);
  }
  return -1;
}

int StreamingTrunk::claim_locked(std::unique_lock<std::mutex>& l, int unit) {
  const int n = static_cast<int>(layouts_.size());
  int pick = -1, furthest = -1;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const Buffer& b = *buffers_[i];
    if (b.in_use) continue;
    const int ahead = b.unit < 0 ? n + 1 : (b.unit - unit + n) % n;
    if (b.unit < 0 && b.done.pending > 0) continue;  // a failed read still landing
    if (ahead > furthest) {
      furthest = ahead;
      pick = static_cast<int>(i);
    }
  }
  if (pick < 0) fail("internal: no stream buffer free for trunk unit {}", unit);
  Buffer& b = *buffers_[static_cast<size_t>(pick)];
  cv_.wait(l, [&] { return b.done.pending == 0; });  // its reads write into it until they land
  b.unit = -1;
  return pick;
}

// Every free buffer reads the next streamed unit after the cursor that no buffer holds, in pass
// order and wrapping into the next pass; at most one lap.
void StreamingTrunk::top_up_locked() {
  const int n = static_cast<int>(layouts_.size());
  for (int step = 0; step < n; ++step) {
    const int u = next_streamed(cursor_);
    if (u < 0) return;
    if (find_locked(u) >= 0) {
      cursor_ = u;  // held already (computing or read ahead): look past it
      continue;
    }
    Buffer* free_buffer = nullptr;
    for (auto& b : buffers_) {
      if (b->unit < 0 && !b->in_use && b->done.pending == 0) {
        free_buffer = b.get();
        break;
      }
    }
    if (free_buffer == nullptr) break;
    start_locked(*free_buffer, u, ReaderPool::Priority::kAhead);
    cursor_ = u;
  }
  int64_t ahead = 0;
  bool computing = false;
  for (const auto& b : buffers_) {
    ahead += b->unit >= 0 && !b->in_use;
    computing = computing || b->in_use;
  }
  // Between passes (and at load) every buffer reads ahead; the peak counts those beside a unit
  // that computes, the read-ahead a pass itself has.
  if (computing) stats_.read_ahead_peak = std::max(stats_.read_ahead_peak, ahead);
  trace_counter("trunk read-ahead", {{"units", ahead}});
}

int StreamingTrunk::wait_unit(int unit) {
  std::unique_lock<std::mutex> l(mu_);
  int bi = find_locked(unit);
  if (bi < 0) {
    // Not on its way (the first pass after an error, or an order the read-ahead did not
    // foresee): read it now, at demand priority, and read ahead from here on.
    bi = claim_locked(l, unit);
    start_locked(*buffers_[static_cast<size_t>(bi)], unit, ReaderPool::Priority::kDemand);
    cursor_ = unit;
  }
  Buffer& b = *buffers_[static_cast<size_t>(bi)];
  Stopwatch sw;
  TraceSpan span("trunk wait", "io", {{"unit", unit}});
  cv_.wait(l, [&] { return b.done.pending == 0; });
  stats_.wait_s += sw.elapsed();
  if (!b.done.error.empty()) {
    std::string e = b.done.error;
    b.unit = -1;  // retried on the next pass
    throw IoError(e);
  }
  b.in_use = true;
  // Read the next streamed units into the free buffers while this one computes.
  top_up_locked();
  return bi;
}

const LayerWeights& StreamingTrunk::acquire(int layer) {
  files_.check_identity();
  if (plan_.resident[static_cast<size_t>(layer)])
    return resident_layers_[static_cast<size_t>(layer)];
  Buffer& b = *buffers_[static_cast<size_t>(wait_unit(layer))];
  if (!b.bound) {
    bind_unit(layer, b.mem, &b.layer, nullptr);
    b.bound = true;
  }
  return b.layer;
}

void StreamingTrunk::release(int layer) {
  if (plan_.resident[static_cast<size_t>(layer)]) return;
  std::lock_guard<std::mutex> l(mu_);
  for (auto& b : buffers_) {
    if (b->unit == layer && b->in_use) {
      b->in_use = false;
      b->unit = -1;
    }
  }
  top_up_locked();
}

const HeadWeights& StreamingTrunk::acquire_head() {
  const int u = static_cast<int>(c_.num_layers);
  if (plan_.resident[static_cast<size_t>(u)]) return resident_head_;
  Buffer& b = *buffers_[static_cast<size_t>(wait_unit(u))];
  if (!b.bound) {
    bind_unit(u, b.mem, nullptr, &b.head);
    b.bound = true;
  }
  return b.head;
}

void StreamingTrunk::release_head() {
  release(static_cast<int>(c_.num_layers));
}

const RouterWeights* StreamingTrunk::router(int layer) const {
  if (!plan_.prefetch || layer < c_.first_k_dense || layer >= c_.num_layers) return nullptr;
  return &routers_[static_cast<size_t>(layer)];
}

void StreamingTrunk::embed(std::span<const int32_t> tokens, float* out) {
  const int64_t H = c_.hidden;
  std::vector<uint16_t> row(static_cast<size_t>(H));
  for (size_t r = 0; r < tokens.size(); ++r) {
    const uint64_t off =
        embed_info_->offset + static_cast<uint64_t>(tokens[r]) * static_cast<uint64_t>(H) * 2;
    files_.read_buffered(embed_info_->shard, off, static_cast<uint64_t>(H) * 2, row.data(),
                         fmt::format("the embedding row of token {}", tokens[r]));
    for (int64_t i = 0; i < H; ++i)
      out[static_cast<int64_t>(r) * H + i] = bf16_to_f32(row[static_cast<size_t>(i)]);
  }
}

TrunkStats StreamingTrunk::stats() const {
  TrunkStats s;
  {
    std::lock_guard<std::mutex> l(mu_);
    s = stats_;
  }
  s.read_s = pool_.busy_seconds();
  return s;
}

std::string StreamingTrunk::describe() const {
  size_t n = 0;
  for (bool r : plan_.resident) n += r;
  const char* format = plan_.trunk == TrunkFormat::kInt8 ? " (int8, lossy)" : "";
  if (n == plan_.resident.size())
    return fmt::format("all {} trunk units resident{}, none streamed", n, format);
  return fmt::format("{} of {} trunk units resident{}, the rest streamed ({})", n,
                     plan_.resident.size(), format,
                     files_.direct() ? "O_DIRECT" : "buffered reads");
}

}  // namespace deltafin
