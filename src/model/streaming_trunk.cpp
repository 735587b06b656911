#include "model/streaming_trunk.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/file_io.h"
#include "core/mapped_file.h"
#include "core/timer.h"
#include "core/weight_buffer.h"
#include "model/checkpoint.h"
#include "model/inventory.h"

namespace deltafin {

namespace {
constexpr uint64_t kChunk = 8ull << 20;

uint8_t* alloc_aligned(uint64_t n) {
  return alloc_weight_buffer(n, "trunk weights");
}
}  // namespace

StreamingTrunk::StreamingTrunk(const ModelConfig& c, const Checkpoint& ck, const MemoryPlan& plan,
                               const BindOptions& bind, int readers, bool direct_io)
    : c_(c), ck_(ck), plan_(plan), bind_(bind) {
  for (const auto& m : ck.shards()) {
    fds_.push_back(open_for_reading(m.path(), direct_io, &direct_ok_));
    buffered_fds_.push_back(open_for_reading(m.path(), false));
  }
  if (!direct_io) direct_ok_ = false;
  embed_info_ = &ck.get("language_model.model.embed_tokens.weight");
  if (embed_info_->dtype != DType::kBF16) fail("{}: the embedding must be BF16", embed_info_->name);
  for (int i = 0; i < std::max(1, readers); ++i) readers_.emplace_back([this] { reader_loop(); });

  const int L = static_cast<int>(c.num_layers);
  for (int u = 0; u <= L; ++u) layouts_.push_back(layout_for(u));
  resident_layers_.resize(static_cast<size_t>(L));
  // Resident units: read once (all of them together), bind, quantise if asked.
  std::vector<Completion> comps(layouts_.size());
  std::vector<uint8_t*> mems(layouts_.size(), nullptr);
  {
    std::lock_guard<std::mutex> l(mu_);
    for (int u = 0; u <= L; ++u) {
      if (!plan_.resident[static_cast<size_t>(u)]) continue;
      mems[u] = alloc_aligned(layouts_[u].buf_bytes);
      submit_locked(layouts_[u], mems[u], comps[u]);
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
      mems[u] = nullptr;
      continue;
    }
    bind_unit(u, mems[u], u < L ? &resident_layers_[u] : nullptr,
              u == L ? &resident_head_ : nullptr);
    if (plan_.trunk == TrunkFormat::kInt8) {
      // The BF16 bytes are no longer needed once quantised (small vectors were copied at bind).
      if (u < L) {
        quantize_layer_int8(resident_layers_[u], int8_store_);
      } else {
        quantize_head_int8(resident_head_, int8_store_);
      }
    }
    if (plan_.trunk == TrunkFormat::kInt8) {
      std::free(mems[u]);  // every matrix now points into the int8 copies
    } else {
      resident_mem_.emplace_back(mems[u], std::free);
    }
  }
  if (!first_error.empty()) fail_io("{}", first_error);
  // The router roster for prefetch prediction (copies, so they survive int8 and streaming).
  routers_.resize(static_cast<size_t>(L));
  router_mem_.resize(static_cast<size_t>(L));
  if (plan_.prefetch) {
    for (int i = static_cast<int>(c.first_k_dense); i < L; ++i) {
      auto names = router_tensors(i);
      uint64_t total = 0;
      for (const auto& n : names) total += ck.get(n).nbytes;
      auto& mem = router_mem_[static_cast<size_t>(i)];
      mem.resize(total);
      uint64_t off = 0;
      std::vector<std::pair<const TensorInfo*, const uint8_t*>> got;
      for (const auto& n : names) {
        const TensorInfo& t = ck.get(n);
        if (read_at(buffered_fds_[static_cast<size_t>(t.shard)], mem.data() + off, t.nbytes,
                    t.offset)
                .bytes < t.nbytes) {
          fail_io("short read of {} from {}", n, ck.shards()[t.shard].path());
        }
        got.push_back({&t, mem.data() + off});
        off += t.nbytes;
      }
      TensorLookup lookup =
          [&](const std::string& name) -> std::pair<const TensorInfo*, const uint8_t*> {
        for (size_t k = 0; k < names.size(); ++k) {
          if (names[k] == name) return got[k];
        }
        fail("internal: router tensor {} not read", name);
      };
      routers_[static_cast<size_t>(i)] = bind_router(c, i, lookup);
    }
    // Read with buffered I/O: drop those pages from the cache again (they are small, but the
    // budget should not lean on the page cache).
#if defined(POSIX_FADV_DONTNEED)
    for (int fd : buffered_fds_) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
#endif
  }
  // Stream buffers.
  if (plan_.stream_buffer_bytes > 0) {
    uint64_t need = 0;
    for (int u = 0; u <= L; ++u) {
      if (!plan_.resident[static_cast<size_t>(u)]) need = std::max(need, layouts_[u].buf_bytes);
    }
    for (auto& b : buffers_) {
      b.size = need;
      b.mem = alloc_aligned(need);
    }
    std::lock_guard<std::mutex> l(mu_);
    issue_locked(next_streamed(L));  // the first streamed unit of the first pass
  }
}

StreamingTrunk::~StreamingTrunk() {
  {
    std::unique_lock<std::mutex> l(mu_);
    // Let in-flight reads land in their buffers before those are freed.
    cv_.wait(l, [&] { return buffers_[0].done.pending == 0 && buffers_[1].done.pending == 0; });
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : readers_) t.join();
  for (auto& b : buffers_) std::free(b.mem);
  for (int fd : fds_) ::close(fd);
  for (int fd : buffered_fds_) ::close(fd);
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

void StreamingTrunk::submit_locked(const UnitLayout& l, uint8_t* mem, Completion& done) {
  done.error.clear();
  for (const Span& s : l.spans) {
    for (uint64_t off = 0; off < s.length; off += kChunk) {
      Span part{s.shard, s.file_offset + off, std::min(kChunk, s.length - off), s.buf_offset + off};
      jobs_.push_back({mem, part, &done});
      done.pending++;
    }
  }
  work_cv_.notify_all();
}

void StreamingTrunk::reader_loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    work_cv_.wait(l, [&] { return stop_ || !jobs_.empty(); });
    if (stop_ && jobs_.empty()) return;
    Job j = jobs_.front();
    jobs_.pop_front();
    l.unlock();
    std::string err;
    Stopwatch sw;
    const ReadResult rd = read_at(fds_[static_cast<size_t>(j.span.shard)],
                                  j.dest + j.span.buf_offset, j.span.length, j.span.file_offset);
    const uint64_t got = rd.bytes;
    if (rd.error != 0) {
      err = fmt::format("reading trunk weights from {} at offset {}: {}",
                        ck_.shards()[j.span.shard].path(), j.span.file_offset + got,
                        std::strerror(rd.error));
    }
    // The tail past the end of the file is padding from the 4 KiB widening; tensors end before it.
    const uint64_t file_size = ck_.shards()[j.span.shard].size();
    const uint64_t need = std::min(
        j.span.length, file_size > j.span.file_offset ? file_size - j.span.file_offset : 0);
    if (err.empty() && got < need) {
      err = fmt::format(
          "short read of trunk weights from {}: {} of {} bytes at offset {} (the file is truncated "
          "or "
          "was replaced)",
          ck_.shards()[j.span.shard].path(), got, need, j.span.file_offset);
    }
    const double t = sw.elapsed();
    l.lock();
    stats_.read_s += t;
    if (!err.empty() && j.done->error.empty()) j.done->error = err;
    if (--j.done->pending == 0) cv_.notify_all();
  }
}

void StreamingTrunk::bind_unit(int unit, const uint8_t* mem, LayerWeights* lw, HeadWeights* hw) {
  const UnitLayout& l = layouts_[static_cast<size_t>(unit)];
  TensorLookup lookup =
      [&](const std::string& name) -> std::pair<const TensorInfo*, const uint8_t*> {
    for (size_t k = 0; k < l.names.size(); ++k) {
      if (l.names[k] == name) return {l.infos[k], mem + l.tensor_buf_offset[k]};
    }
    fail("internal: tensor {} is not part of trunk unit {}", name, unit);
  };
  if (lw != nullptr) *lw = bind_layer(c_, unit, lookup, bind_);
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

void StreamingTrunk::issue_locked(int unit) {
  if (unit < 0) return;
  for (auto& b : buffers_) {
    if (b.unit == unit) return;  // already there or on its way
  }
  for (auto& b : buffers_) {
    if (b.unit < 0 && !b.in_use && b.done.pending == 0) {
      b.unit = unit;
      b.bound = false;
      submit_locked(layouts_[static_cast<size_t>(unit)], b.mem, b.done);
      stats_.bytes_streamed += layouts_[static_cast<size_t>(unit)].file_bytes;
      return;
    }
  }
}

void StreamingTrunk::check_files() {
  const double now = now_seconds();
  if (now - last_check_ < 1.0) return;
  last_check_ = now;
  for (const auto& m : ck_.shards()) {
    FileIdentity id;
    try {
      id = file_identity(m.path());
    } catch (const IoError&) {
      fail_io("{} disappeared while running", m.path());
    }
    if (!(id == m.identity())) {
      fail_io(
          "{} was replaced or changed while running (size {} -> {}); restart to use the new file",
          m.path(), m.identity().size, id.size);
    }
  }
}

int StreamingTrunk::wait_unit(int unit) {
  std::unique_lock<std::mutex> l(mu_);
  issue_locked(unit);
  int bi = -1;
  for (int k = 0; k < 2; ++k) {
    if (buffers_[k].unit == unit) bi = k;
  }
  if (bi < 0) fail("internal: no stream buffer free for trunk unit {}", unit);
  Buffer& b = buffers_[bi];
  Stopwatch sw;
  cv_.wait(l, [&] { return b.done.pending == 0; });
  stats_.wait_s += sw.elapsed();
  if (!b.done.error.empty()) {
    std::string e = b.done.error;
    b.unit = -1;  // retried on the next pass
    throw IoError(e);
  }
  b.in_use = true;
  // Read the next streamed unit into the other buffer while this one computes.
  issue_locked(next_streamed(unit));
  return bi;
}

const LayerWeights& StreamingTrunk::acquire(int layer) {
  {
    std::lock_guard<std::mutex> l(mu_);
    check_files();
  }
  if (plan_.resident[static_cast<size_t>(layer)])
    return resident_layers_[static_cast<size_t>(layer)];
  int bi = wait_unit(layer);
  Buffer& b = buffers_[bi];
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
    if (b.unit == layer && b.in_use) {
      b.in_use = false;
      b.unit = -1;
    }
  }
  issue_locked(next_streamed(layer));
}

const HeadWeights& StreamingTrunk::acquire_head() {
  const int u = static_cast<int>(c_.num_layers);
  if (plan_.resident[static_cast<size_t>(u)]) return resident_head_;
  int bi = wait_unit(u);
  Buffer& b = buffers_[bi];
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
  const int fd = buffered_fds_[static_cast<size_t>(embed_info_->shard)];
  for (size_t r = 0; r < tokens.size(); ++r) {
    const uint64_t off =
        embed_info_->offset + static_cast<uint64_t>(tokens[r]) * static_cast<uint64_t>(H) * 2;
    if (read_at(fd, row.data(), static_cast<uint64_t>(H) * 2, off).bytes <
        static_cast<uint64_t>(H) * 2) {
      fail_io("short read of the embedding row of token {} from {}", tokens[r],
              ck_.shards()[embed_info_->shard].path());
    }
    for (int64_t i = 0; i < H; ++i)
      out[static_cast<int64_t>(r) * H + i] = bf16_to_f32(row[static_cast<size_t>(i)]);
  }
}

TrunkStats StreamingTrunk::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

std::string StreamingTrunk::describe() const {
  size_t n = 0;
  for (bool r : plan_.resident) n += r;
  return fmt::format("{} of {} trunk units resident{}, the rest streamed ({})", n,
                     plan_.resident.size(),
                     plan_.trunk == TrunkFormat::kInt8 ? " (int8, lossy)" : "",
                     direct_ok_ ? "O_DIRECT" : "buffered reads");
}

}  // namespace deltafin
