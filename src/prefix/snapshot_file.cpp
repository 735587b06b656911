// Snapshot files (see snapshot_file.h).
#include "prefix/snapshot_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/fault_inject.h"
#include "core/file_io.h"

namespace deltafin {

namespace snapshot_file_impl {

constexpr const char* kMagic = "deltafin-snapshot";
constexpr int kVersion = 1;
constexpr uint64_t kHeaderBytes = kIoAlign;
constexpr uint64_t kChunk = 4ull << 20;  // staging buffer: the unit of one read or write

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, AlignedFree>;

AlignedBuffer aligned_buffer(uint64_t bytes) {
  void* p = nullptr;
  if (::posix_memalign(&p, kIoAlign, bytes) != 0) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return AlignedBuffer(static_cast<uint8_t*>(p));
}

// A 64-bit checksum of a byte stream fed in pieces of any size (words of 8 bytes, mixed).
class Checksum {
 public:
  void update(const void* data, uint64_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      const uint64_t take = std::min<uint64_t>(n, 8 - used_);
      std::memcpy(word_ + used_, p, take);
      used_ += take;
      p += take;
      n -= take;
      if (used_ == 8) mix();
    }
  }
  uint64_t digest() {
    if (used_ > 0) {
      std::memset(word_ + used_, 0, 8 - used_);
      mix();
    }
    return h_ ^ (h_ >> 31);
  }

 private:
  void mix() {
    uint64_t w = 0;
    std::memcpy(&w, word_, 8);
    h_ ^= w * 0x9E3779B97F4A7C15ull;
    h_ = (h_ << 27 | h_ >> 37) * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
    used_ = 0;
  }
  uint64_t h_ = 0x243F6A8885A308D3ull;
  uint8_t word_[8] = {};
  uint64_t used_ = 0;
};

struct Section {
  const void* data;
  uint64_t bytes;
};

std::vector<Section> sections_of(std::span<const int32_t> ids, const State& s,
                                 const DraftRows* draft) {
  std::vector<Section> out;
  out.push_back({ids.data(), ids.size_bytes()});
  for (const auto& k : s.kda()) {
    out.push_back({k.S.data(), k.S.size() * sizeof(float)});
    out.push_back({k.conv.data(), k.conv.size() * sizeof(float)});
  }
  const auto n = static_cast<uint64_t>(ids.size());
  for (const auto& m : s.mla()) out.push_back({m.rows.data(), n * m.width * sizeof(float)});
  if (draft != nullptr) {
    out.push_back({draft->rows.data(), draft->rows.size() * sizeof(float)});
    out.push_back({draft->tail.data(), draft->tail.size() * sizeof(float)});
  }
  return out;
}

nlohmann::json shape_json(const StateShape& s) {
  nlohmann::json kda = nlohmann::json::array(), mla = nlohmann::json::array();
  for (const auto& [S, conv] : s.kda) kda.push_back({S, conv});
  for (const auto w : s.mla) mla.push_back(w);
  return {{"kda", kda}, {"mla", mla}};
}

[[noreturn]] void io_failed(const std::string& path, int err) {
  if (err == ENOSPC) fail_io("cannot write {}: the disk is full", path);
  fail_io("cannot write {}: {}", path, std::strerror(err));
}

void read_exactly(int fd, const std::string& path, void* dst, uint64_t n, uint64_t offset) {
  if (faults_enabled()) {
    const ReadFault f = read_fault("snapshot", path);
    if (f.kind == FaultKind::slow)
      std::this_thread::sleep_for(std::chrono::milliseconds(f.delay_ms));
    if (f.kind == FaultKind::eio) fail_io("cannot read {}: {}", path, std::strerror(EIO));
    if (f.kind == FaultKind::short_read || f.kind == FaultKind::shrink)
      fail_io("cannot read {}: the file ends early", path);
  }
  const ReadResult r = read_at(fd, dst, n, offset);
  if (r.error != 0) fail_io("cannot read {}: {}", path, std::strerror(r.error));
  if (r.bytes != n) fail_io("cannot read {}: the file ends early", path);
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace snapshot_file_impl

using namespace snapshot_file_impl;

bool is_snapshot_temp(const std::string& name) {
  const std::string infix = std::string(".dfsnap") + kSnapshotTempInfix;
  const size_t at = name.rfind(infix);
  if (at == std::string::npos) return name.ends_with(".dfsnap.tmp");  // an older build's name
  const std::string rest = name.substr(at + infix.size());
  return rest.size() == 16 && rest.find_first_not_of("0123456789abcdef") == std::string::npos;
}

void write_snapshot_file(const std::string& path, const std::string& model_id,
                         std::span<const int32_t> ids, const State& state, const DraftRows* draft,
                         const std::string& draft_id) {
  // A private file under a name nobody can plant in advance (the state holds the conversation).
  const std::string tmp = with_random_suffix(path + kSnapshotTempInfix);
  const std::vector<Section> sections = sections_of(ids, state, draft);
  uint64_t payload = 0;
  for (const auto& s : sections) payload += s.bytes;
  Fd out;
  out.fd = create_new_file(tmp, true);
  struct Cleanup {
    const std::string& tmp;
    bool done = false;
    ~Cleanup() {
      if (!done) ::unlink(tmp.c_str());
    }
  } cleanup{tmp};
  AlignedBuffer buf = aligned_buffer(kChunk);
  Checksum sum;
  uint64_t offset = kHeaderBytes, filled = 0;
  auto flush = [&](uint64_t bytes) {
    int err = faults_enabled() ? write_fault("snapshot", path) : 0;
    if (err == 0) err = write_at(out.fd, buf.get(), bytes, offset);
    if (err != 0) io_failed(path, err);
    offset += bytes;
    filled = 0;
  };
  for (const auto& s : sections) {
    sum.update(s.data, s.bytes);
    const auto* p = static_cast<const uint8_t*>(s.data);
    uint64_t left = s.bytes;
    while (left > 0) {
      const uint64_t take = std::min(left, kChunk - filled);
      std::memcpy(buf.get() + filled, p, take);
      filled += take;
      p += take;
      left -= take;
      if (filled == kChunk) flush(kChunk);
    }
  }
  if (filled > 0) {
    const uint64_t padded = io_align_up(filled);
    std::memset(buf.get() + filled, 0, padded - filled);
    flush(padded);
  }
  nlohmann::json h = {{"magic", kMagic},
                      {"version", kVersion},
                      {"model", model_id},
                      {"n", ids.size()},
                      {"shape", shape_json(state.shape())},
                      {"payload", payload},
                      {"checksum", sum.digest()}};
  if (draft != nullptr) {
    h["draft"] = {{"id", draft_id},
                  {"width", draft->width},
                  {"lag", draft->lag},
                  {"rows", draft->rows.size()},
                  {"tail", draft->tail.size()}};
  }
  const std::string text = h.dump();
  if (text.size() >= kHeaderBytes) fail("snapshot header of {} bytes is too long", text.size());
  std::memset(buf.get(), 0, kHeaderBytes);
  std::memcpy(buf.get(), text.data(), text.size());
  offset = 0;
  flush(kHeaderBytes);
  if (::fsync(out.fd) != 0) io_failed(path, errno);
  ::close(out.fd);
  out.fd = -1;
  if (::rename(tmp.c_str(), path.c_str()) != 0) io_failed(path, errno);
  cleanup.done = true;
}

std::optional<SnapshotFile> read_snapshot_header(const std::string& path,
                                                 const std::string& model_id,
                                                 const StateShape& shape, std::string* why) {
  try {
    Fd in;
    in.fd = open_regular_for_reading(path, true);
    struct stat st {};
    if (::fstat(in.fd, &st) != 0) fail_io("cannot stat {}: {}", path, std::strerror(errno));
    AlignedBuffer head = aligned_buffer(kHeaderBytes);
    read_exactly(in.fd, path, head.get(), kHeaderBytes, 0);
    const char* text = reinterpret_cast<const char*>(head.get());
    const nlohmann::json h =
        nlohmann::json::parse(text, text + strnlen(text, kHeaderBytes), nullptr, false);
    if (!h.is_object() || h.value("magic", "") != kMagic)
      fail("not a snapshot file (no deltafin-snapshot header)");
    if (h.value("version", 0) != kVersion)
      fail("snapshot format {} (this build reads {})", h.value("version", 0), kVersion);
    if (h.value("model", "") != model_id) fail("it belongs to another model or checkpoint");
    if (h.value("shape", nlohmann::json()) != shape_json(shape)) fail("its state shape differs");
    const uint64_t n = h.at("n").get<uint64_t>(), payload = h.at("payload").get<uint64_t>();
    if (static_cast<uint64_t>(st.st_size) < kHeaderBytes + payload)
      fail("it is truncated ({} of {} bytes)", st.st_size, kHeaderBytes + payload);
    if (n * sizeof(int32_t) > payload) fail("its prefix does not fit its payload");
    SnapshotFile f;
    f.path = path;
    f.bytes = static_cast<uint64_t>(st.st_size);
    f.used = static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9;
    if (const auto d = h.find("draft"); d != h.end() && d->is_object()) {
      f.has_draft = true;
      f.draft_id = d->value("id", "");
    }
    const uint64_t id_bytes = io_align_up(n * sizeof(int32_t));
    AlignedBuffer ids = aligned_buffer(std::max<uint64_t>(id_bytes, kIoAlign));
    if (id_bytes > 0) read_exactly(in.fd, path, ids.get(), id_bytes, kHeaderBytes);
    f.ids.resize(n);
    std::memcpy(f.ids.data(), ids.get(), n * sizeof(int32_t));
    return f;
  } catch (const std::exception& e) {
    if (why != nullptr) *why = e.what();
    return std::nullopt;
  }
}

void read_snapshot_file(const SnapshotFile& f, const std::string& model_id, State& state,
                        const std::string& draft_id, std::optional<DraftRows>* draft) {
  Fd in;
  in.fd = open_regular_for_reading(f.path, true);
  AlignedBuffer head = aligned_buffer(kHeaderBytes);
  read_exactly(in.fd, f.path, head.get(), kHeaderBytes, 0);
  const char* text = reinterpret_cast<const char*>(head.get());
  const nlohmann::json h =
      nlohmann::json::parse(text, text + strnlen(text, kHeaderBytes), nullptr, false);
  if (!h.is_object() || h.value("model", "") != model_id ||
      h.value("shape", nlohmann::json()) != shape_json(state.shape()))
    fail("{}: the header changed since it was indexed", f.path);
  const uint64_t n = f.ids.size();
  for (auto& m : state.mla()) m.rows.assign(n * static_cast<uint64_t>(m.width), 0.0f);
  std::optional<DraftRows> rows;
  std::vector<int32_t> ids(n);
  if (const auto d = h.find("draft"); d != h.end() && d->is_object()) {
    rows.emplace();
    rows->width = d->at("width").get<int64_t>();
    rows->lag = d->at("lag").get<int64_t>();
    rows->rows.resize(d->at("rows").get<uint64_t>());
    rows->tail.resize(d->at("tail").get<uint64_t>());
  }
  std::vector<std::pair<void*, uint64_t>> dst;
  dst.push_back({ids.data(), n * sizeof(int32_t)});
  for (auto& k : state.kda()) {
    dst.push_back({k.S.data(), k.S.size() * sizeof(float)});
    dst.push_back({k.conv.data(), k.conv.size() * sizeof(float)});
  }
  for (auto& m : state.mla()) dst.push_back({m.rows.data(), m.rows.size() * sizeof(float)});
  if (rows) {
    dst.push_back({rows->rows.data(), rows->rows.size() * sizeof(float)});
    dst.push_back({rows->tail.data(), rows->tail.size() * sizeof(float)});
  }
  uint64_t payload = 0;
  for (const auto& d : dst) payload += d.second;
  if (payload != h.value("payload", uint64_t{0}))
    fail("{}: its sections do not add up to its payload", f.path);
  AlignedBuffer buf = aligned_buffer(kChunk);
  Checksum sum;
  uint64_t offset = kHeaderBytes, have = 0, at = 0;  // bytes in buf, read position in buf
  for (const auto& [ptr, bytes] : dst) {
    auto* p = static_cast<uint8_t*>(ptr);
    uint64_t left = bytes;
    while (left > 0) {
      if (at == have) {
        const uint64_t remaining = io_align_up(kHeaderBytes + payload) - offset;
        have = std::min(kChunk, remaining);
        read_exactly(in.fd, f.path, buf.get(), have, offset);
        offset += have;
        at = 0;
      }
      const uint64_t take = std::min(left, have - at);
      std::memcpy(p, buf.get() + at, take);
      sum.update(p, take);
      at += take;
      p += take;
      left -= take;
    }
  }
  if (sum.digest() != h.value("checksum", uint64_t{0}))
    fail("{}: its checksum does not match (the file is corrupt)", f.path);
  if (ids != f.ids) fail("{}: its prefix changed since it was indexed", f.path);
  state.set_position(static_cast<int64_t>(n));
  state.set_consistent(true);
  if (draft != nullptr) {
    draft->reset();
    if (rows && h["draft"].value("id", "") == draft_id) *draft = std::move(rows);
  }
  ::futimens(in.fd, nullptr);  // last use, for the LRU order (the file read, not a name)
}

}  // namespace deltafin
