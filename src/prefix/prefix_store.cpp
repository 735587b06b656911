// The prefix store (see prefix_store.h).
#include "prefix/prefix_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "core/error.h"
#include "core/file_io.h"
#include "core/log.h"
#include "core/timer.h"

namespace deltafin {

namespace fs = std::filesystem;

// warned_ holds this key while snapshot writes fail (no warning line reads like it).
constexpr const char* kWritesFailing = "\x01snapshot writes failing";

struct PrefixStore::Snap {
  std::vector<KdaLayerState> kda;
  bool has_draft = false;
  std::vector<float> draft_tail;
};

struct PrefixStore::Node {
  Node* parent = nullptr;
  int64_t start = 0;                    // the position of tokens[0]
  std::vector<int32_t> tokens;          // the span this node covers
  std::vector<std::vector<float>> mla;  // per MLA layer: the span's cache rows
  bool has_draft = false;
  int64_t dbegin = 0;          // the draft rows hold positions [dbegin, dbegin + count)
  std::vector<float> draft;    // [count][draft width]
  std::unique_ptr<Snap> snap;  // the state at end()
  std::map<int32_t, std::unique_ptr<Node>> children;
  uint64_t used = 0;
  int64_t end() const { return start + static_cast<int64_t>(tokens.size()); }
};

namespace prefix_store_impl {

uint64_t hash_bytes(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

template <class T>
uint64_t vec_bytes(const std::vector<T>& v) {
  return v.size() * sizeof(T);
}

// Positions [from, to) of `rows` ([positions][width], starting at `begin`).
std::vector<float> rows_between(const std::vector<float>& rows, int64_t begin, int64_t width,
                                int64_t from, int64_t to) {
  if (to <= from) return {};
  return std::vector<float>(rows.begin() + (from - begin) * width,
                            rows.begin() + (to - begin) * width);
}

}  // namespace prefix_store_impl

using namespace prefix_store_impl;

std::string checkpoint_id(const std::string& config_text,
                          const std::vector<std::string>& tensor_lines) {
  uint64_t h = hash_bytes(config_text.data(), config_text.size());
  for (const auto& l : tensor_lines) h = hash_bytes(l.data(), l.size() + 1, h);
  return fmt::format("{:016x}", h);
}

PrefixStore::PrefixStore(const ModelConfig& config, PrefixStoreOptions options)
    : config_(config),
      shape_(StateShape::of(config)),
      o_(std::move(options)),
      root_(std::make_unique<Node>()) {
  if (!o_.dir.empty()) index_disk();
}

PrefixStore::~PrefixStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the folder for the next process
}

std::string PrefixStore::file_for(std::span<const int32_t> ids) const {
  return (fs::path(o_.dir) /
          fmt::format("{:016x}-{}.dfsnap", hash_bytes(ids.data(), ids.size_bytes()), ids.size()))
      .string();
}

void PrefixStore::disk_warning_locked(const std::string& line) {
  if (warned_.insert(line).second) log_warn("state cache: {}", line);
}

namespace {

// What a folder entry that is not a regular file is, for the warning that skips it.
const char* entry_kind(fs::file_type t) {
  switch (t) {
    case fs::file_type::directory:
      return "a folder";
    case fs::file_type::fifo:
      return "a FIFO";
    case fs::file_type::symlink:
      return "a symbolic link";
    case fs::file_type::block:
    case fs::file_type::character:
      return "a device";
    case fs::file_type::socket:
      return "a socket";
    default:
      return "not a regular file";
  }
}

}  // namespace

bool PrefixStore::lock_folder() {
  const std::string path = (fs::path(o_.dir) / kStateCacheLock).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string why = fd < 0 ? std::strerror(errno) : "it is not a regular file";
    if (fd >= 0) ::close(fd);
    disk_warning_locked(fmt::format(
        "cannot use {}: its lock file {} cannot be opened ({}); snapshots stay in RAM only and "
        "do not outlive this process",
        o_.dir, path, why));
    return false;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      char buf[32] = {};
      const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
      const std::string_view pid(buf, n > 0 ? static_cast<size_t>(n) : 0);
      const bool named = !pid.empty() && pid.find_first_not_of("0123456789") == pid.npos;
      ::close(fd);
      disk_warning_locked(fmt::format(
          "{} is in use by another deltafin process (pid {}): snapshots stay in RAM only and do "
          "not outlive this process (give each process its own --state-cache folder)",
          o_.dir, named ? pid : std::string_view("?")));
      return false;
    }
    // A file system without locks (some network mounts): nothing to coordinate with.
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd, 0) == 0) {
    [[maybe_unused]] const ssize_t w = ::pwrite(fd, pid.data(), pid.size(), 0);
  }
  lock_fd_ = fd;
  return true;
}

void PrefixStore::index_disk() {
  std::error_code ec;
  try {
    make_private_dirs(o_.dir);
  } catch (const Error& e) {
    disk_warning_locked(fmt::format(
        "cannot use {} ({}): snapshots stay in RAM only and do not outlive this process", o_.dir,
        e.what()));
    return;
  }
  if (!lock_folder()) return;
  disk_ = true;
  for (const auto& e : fs::directory_iterator(o_.dir, ec)) {
    const std::string path = e.path().string();
    const std::string name = e.path().filename().string();
    const bool snap = e.path().extension() == ".dfsnap";
    if (!snap && !is_snapshot_temp(name)) continue;
    // Only regular files are ours: a FIFO would block the open, a link would lead elsewhere, and
    // neither is removed (we delete only what we made).
    const fs::file_type type = e.symlink_status(ec).type();
    if (type != fs::file_type::regular) {
      disk_warning_locked(fmt::format("ignoring {}: it is {}, not a snapshot file; left as it is",
                                      path, entry_kind(type)));
      continue;
    }
    if (!snap) {  // a write that did not finish
      fs::remove(e.path(), ec);
      continue;
    }
    std::string why;
    auto f = read_snapshot_header(path, o_.model_id, shape_, &why);
    if (!f) {
      disk_warning_locked(fmt::format("ignoring {}: {}; removed", path, why));
      fs::remove(e.path(), ec);
      continue;
    }
    // An older build wrote snapshots readable by everyone: they hold conversations.
    if ((e.symlink_status(ec).permissions() & (fs::perms::group_all | fs::perms::others_all)) !=
        fs::perms::none)
      ::chmod(path.c_str(), 0600);
    disk_used_ += f->bytes;
    files_.push_back(std::move(*f));
  }
}

uint64_t PrefixStore::node_bytes(const Node& n) const {
  uint64_t b = vec_bytes(n.tokens) + vec_bytes(n.draft) + sizeof(Node);
  for (const auto& m : n.mla) b += vec_bytes(m);
  if (n.snap) {
    for (const auto& k : n.snap->kda) b += vec_bytes(k.S) + vec_bytes(k.conv);
    b += vec_bytes(n.snap->draft_tail);
  }
  return b;
}

PrefixStore::Node* PrefixStore::insert_locked(std::span<const int32_t> ids, const State& state,
                                              const DraftRows* rows, const std::string& draft_id) {
  const auto n = static_cast<int64_t>(ids.size());
  if (rows != nullptr && draft_id_.empty() && root_->children.empty()) {
    draft_id_ = draft_id;
    draft_width_ = rows->width;
    draft_lag_ = rows->lag;
  }
  const bool with_draft = rows != nullptr && draft_id == draft_id_ && rows->width == draft_width_ &&
                          rows->lag == draft_lag_ && rows->begin == 0 &&
                          rows->count() == std::max<int64_t>(0, n - draft_lag_);
  const int64_t lag = draft_lag_, dw = draft_width_;
  auto dspan = [lag](int64_t start, int64_t end) {
    return std::make_pair(std::max<int64_t>(0, start - lag), std::max<int64_t>(0, end - lag));
  };
  auto fill_draft = [&](Node& node) {
    const auto [a, b] = dspan(node.start, node.end());
    node.draft = rows_between(rows->rows, 0, dw, a, b);
    node.dbegin = a;
    node.has_draft = true;
  };
  Node* node = root_.get();
  int64_t pos = 0;
  while (pos < n) {
    auto it = node->children.find(ids[static_cast<size_t>(pos)]);
    if (it == node->children.end()) {
      auto leaf = std::make_unique<Node>();
      leaf->parent = node;
      leaf->start = pos;
      leaf->tokens.assign(ids.begin() + pos, ids.end());
      for (const auto& m : state.mla()) {
        leaf->mla.emplace_back(m.rows.begin() + pos * m.width, m.rows.begin() + n * m.width);
      }
      if (with_draft) fill_draft(*leaf);
      Node* raw = leaf.get();
      node->children.emplace(ids[static_cast<size_t>(pos)], std::move(leaf));
      node = raw;
      pos = n;
      break;
    }
    Node* c = it->second.get();
    const auto span = std::span<const int32_t>(c->tokens);
    const auto rest = ids.subspan(static_cast<size_t>(pos));
    const size_t k = static_cast<size_t>(
        std::mismatch(span.begin(), span.end(), rest.begin(), rest.end()).first - span.begin());
    if (k < c->tokens.size()) {  // split c: its first k tokens stay, the rest moves below
      auto tail = std::make_unique<Node>();
      tail->parent = c;
      tail->start = c->start + static_cast<int64_t>(k);
      tail->tokens.assign(c->tokens.begin() + static_cast<ptrdiff_t>(k), c->tokens.end());
      c->tokens.resize(k);
      for (auto& m : c->mla) {
        const size_t w = m.size() / (k + tail->tokens.size());
        tail->mla.emplace_back(m.begin() + static_cast<ptrdiff_t>(k * w), m.end());
        m.resize(k * w);
      }
      if (c->has_draft) {
        const int64_t q = dspan(tail->start, tail->start).first;
        tail->draft.assign(c->draft.begin() + (q - c->dbegin) * dw, c->draft.end());
        c->draft.resize(static_cast<size_t>((q - c->dbegin) * dw));
        tail->dbegin = q;
        tail->has_draft = true;
      }
      tail->snap = std::move(c->snap);
      tail->children = std::move(c->children);
      for (auto& [_, g] : tail->children) g->parent = tail.get();
      tail->used = c->used;
      c->children.clear();
      c->children.emplace(tail->tokens[0], std::move(tail));
    }
    if (with_draft && !c->has_draft) fill_draft(*c);
    node = c;
    pos += static_cast<int64_t>(k);
  }
  if (node == root_.get()) return nullptr;
  if (!node->snap) ++ram_snaps_;
  node->snap = std::make_unique<Snap>();
  node->snap->kda = state.kda();
  if (with_draft) {
    node->snap->has_draft = true;
    node->snap->draft_tail = rows->tail;
  }
  for (Node* p = node; p != nullptr; p = p->parent) p->used = ++clock_;
  return node;
}

// Removes a leaf, then every ancestor left with neither a snapshot nor children.
void PrefixStore::drop_node_locked(Node* n) {
  while (n != root_.get() && n->children.empty()) {
    Node* parent = n->parent;
    if (n->snap) --ram_snaps_;
    parent->children.erase(n->tokens[0]);
    n = parent;
    if (n->snap) break;
  }
}

void PrefixStore::evict_locked() {
  auto total = [&] {
    uint64_t b = 0;
    std::vector<Node*> stack = {root_.get()};
    while (!stack.empty()) {
      Node* x = stack.back();
      stack.pop_back();
      b += node_bytes(*x);
      for (auto& [_, c] : x->children) stack.push_back(c.get());
    }
    return b;
  };
  ram_used_ = total();
  while (ram_used_ > o_.ram_bytes && !root_->children.empty()) {
    // The least recently used leaf: a prefix shared by kept conversations is never a leaf.
    Node* victim = nullptr;
    std::vector<Node*> stack = {root_.get()};
    while (!stack.empty()) {
      Node* x = stack.back();
      stack.pop_back();
      if (x != root_.get() && x->children.empty() && (victim == nullptr || x->used < victim->used))
        victim = x;
      for (auto& [_, c] : x->children) stack.push_back(c.get());
    }
    if (victim == nullptr) break;
    drop_node_locked(victim);
    ram_used_ = total();
  }
  if (root_->children.empty()) {  // an empty tree may take another drafter's rows
    draft_id_.clear();
    draft_width_ = draft_lag_ = 0;
  }
}

void PrefixStore::write_through_locked(std::span<const int32_t> ids, const State& state,
                                       const DraftRows* rows, const std::string& draft_id) {
  if (!disk_) return;
  for (auto& f : files_) {
    if (f.ids.size() == ids.size() && std::equal(f.ids.begin(), f.ids.end(), ids.begin())) {
      f.used = now_seconds();
      return;  // already on disk
    }
  }
  const std::string path = file_for(ids);
  try {
    write_snapshot_file(path, o_.model_id, ids, state, rows, draft_id);
  } catch (const std::exception& e) {
    ++stats_.disk_errors;
    // Said once while writes keep failing (the key stays in warned_ until one succeeds), so a
    // full disk is one line, not one per snapshot.
    if (warned_.insert(kWritesFailing).second) {
      log_warn(
          "state cache: {}; snapshots are kept in RAM only until a write succeeds again "
          "(deltafin_state_cache_disk_errors_total counts the failed writes)",
          e.what());
    }
    return;
  }
  warned_.erase(kWritesFailing);
  std::string why;
  auto f = read_snapshot_header(path, o_.model_id, shape_, &why);
  if (!f) {
    ++stats_.disk_errors;
    disk_warning_locked(fmt::format("{} could not be read back: {}", path, why));
    std::error_code ec;
    fs::remove(path, ec);
    return;
  }
  ++stats_.disk_writes;
  f->used = now_seconds();
  disk_used_ += f->bytes;
  files_.push_back(std::move(*f));
  // Least recently used files go first while the folder holds more than its share.
  while (disk_used_ > o_.disk_bytes && !files_.empty()) {
    auto oldest = std::min_element(files_.begin(), files_.end(),
                                   [](const auto& a, const auto& b) { return a.used < b.used; });
    std::error_code ec;
    fs::remove(oldest->path, ec);
    disk_used_ -= oldest->bytes;
    files_.erase(oldest);
  }
}

void PrefixStore::save(std::span<const int32_t> ids, const State& state, Drafter* drafter) {
  if (ids.empty() || static_cast<int64_t>(ids.size()) != state.position() || !state.consistent())
    return;
  std::optional<DraftRows> rows;
  std::string draft_id;
  if (drafter != nullptr && drafter->keeps_state()) {
    rows = drafter->save(ids, 0);
    draft_id = drafter->state_id();
  }
  std::lock_guard<std::mutex> lock(m_);
  ++stats_.saves;
  if (o_.ram_bytes > 0) {
    insert_locked(ids, state, rows ? &*rows : nullptr, draft_id);
    evict_locked();
  }
  write_through_locked(ids, state, rows ? &*rows : nullptr, draft_id);
}

Restored PrefixStore::restore(std::span<const int32_t> ids, int64_t limit, State& state,
                              Drafter* drafter) {
  Stopwatch sw;
  Restored r;
  limit = std::min<int64_t>(limit, static_cast<int64_t>(ids.size()));
  const bool draft_wanted = drafter != nullptr && drafter->keeps_state();
  const std::string want_id = draft_wanted ? drafter->state_id() : "";
  std::optional<DraftRows> rows;
  std::unique_lock<std::mutex> lock(m_);
  ++stats_.lookups;
  // RAM: the deepest node on the path whose end holds a snapshot.
  std::vector<Node*> path;
  size_t best = 0;  // path[best - 1] is the snapshot (0: none)
  int64_t pos = 0;
  for (Node* node = root_.get(); pos < limit;) {
    auto it = node->children.find(ids[static_cast<size_t>(pos)]);
    if (it == node->children.end()) break;
    Node* c = it->second.get();
    const auto k = static_cast<int64_t>(c->tokens.size());
    if (pos + k > limit || !std::equal(c->tokens.begin(), c->tokens.end(), ids.begin() + pos))
      break;
    path.push_back(c);
    pos += k;
    if (c->snap) best = path.size();
    node = c;
  }
  const int64_t ram_at = best > 0 ? path[best - 1]->end() : 0;
  // Disk: the longest file prefix, tried deepest first; a file that fails is removed.
  for (;;) {
    SnapshotFile* f = nullptr;
    for (auto& c : files_) {
      const auto n = static_cast<int64_t>(c.ids.size());
      if (n > ram_at && n <= limit && (f == nullptr || n > static_cast<int64_t>(f->ids.size())) &&
          std::equal(c.ids.begin(), c.ids.end(), ids.begin()))
        f = &c;
    }
    if (f == nullptr) break;
    State loaded(config_);
    try {
      read_snapshot_file(*f, o_.model_id, loaded, want_id, &rows);
    } catch (const std::exception& e) {
      ++stats_.disk_errors;
      std::string why = e.what();  // most reasons start with the path: name it once
      if (why.starts_with(f->path + ": ")) why.erase(0, f->path.size() + 2);
      std::error_code ec;
      // Replaced since it was indexed by something that is not a file of ours: left as it is.
      const bool ours = fs::symlink_status(f->path, ec).type() == fs::file_type::regular;
      disk_warning_locked(
          fmt::format("ignoring {}: {}; {}", f->path, why, ours ? "removed" : "left as it is"));
      if (ours) fs::remove(f->path, ec);
      disk_used_ -= f->bytes;
      files_.erase(files_.begin() + (f - files_.data()));
      rows.reset();
      continue;
    }
    f->used = now_seconds();
    r.position = loaded.position();
    r.from_disk = true;
    ++stats_.disk_hits;
    if (o_.ram_bytes > 0) {  // hot again: back into the RAM tier
      insert_locked(ids.first(static_cast<size_t>(r.position)), loaded, rows ? &*rows : nullptr,
                    want_id);
      evict_locked();
    }
    state = std::move(loaded);
    break;
  }
  if (!r.from_disk && best > 0) {
    const Node* snap_node = path[best - 1];
    State s(config_);
    s.kda() = snap_node->snap->kda;
    for (size_t l = 0; l < s.mla().size(); ++l) {
      auto& rows_l = s.mla()[l].rows;
      for (size_t i = 0; i < best; ++i)
        rows_l.insert(rows_l.end(), path[i]->mla[l].begin(), path[i]->mla[l].end());
    }
    s.set_position(ram_at);
    bool draft_ok = draft_wanted && want_id == draft_id_ && snap_node->snap->has_draft;
    for (size_t i = 0; i < best && draft_ok; ++i) draft_ok = path[i]->has_draft;
    if (draft_ok) {
      rows.emplace();
      rows->width = draft_width_;
      rows->lag = draft_lag_;
      for (size_t i = 0; i < best; ++i)
        rows->rows.insert(rows->rows.end(), path[i]->draft.begin(), path[i]->draft.end());
      rows->tail = snap_node->snap->draft_tail;
    }
    for (size_t i = 0; i < best; ++i) path[i]->used = ++clock_;
    r.position = ram_at;
    ++stats_.ram_hits;
    state = std::move(s);
  }
  stats_.tokens_reused += r.position;
  lock.unlock();
  if (r.position > 0 && draft_wanted) {
    r.with_draft = rows.has_value();
    drafter->restore(state, ids.first(static_cast<size_t>(r.position)), rows ? &*rows : nullptr);
  }
  r.seconds = sw.elapsed();
  return r;
}

bool PrefixStore::has(std::span<const int32_t> ids) const {
  std::lock_guard<std::mutex> lock(m_);
  for (const auto& f : files_) {
    if (f.ids.size() == ids.size() && std::equal(f.ids.begin(), f.ids.end(), ids.begin()))
      return true;
  }
  const Node* node = root_.get();
  size_t pos = 0;
  while (pos < ids.size()) {
    auto it = node->children.find(ids[pos]);
    if (it == node->children.end()) return false;
    const Node* c = it->second.get();
    if (pos + c->tokens.size() > ids.size() ||
        !std::equal(c->tokens.begin(), c->tokens.end(), ids.begin() + static_cast<ptrdiff_t>(pos)))
      return false;
    pos += c->tokens.size();
    node = c;
  }
  return node != root_.get() && node->snap != nullptr;
}

PrefixStats PrefixStore::stats() const {
  std::lock_guard<std::mutex> lock(m_);
  PrefixStats s = stats_;
  s.ram_snapshots = ram_snaps_;
  s.ram_bytes = ram_used_;
  s.disk_snapshots = static_cast<int64_t>(files_.size());
  s.disk_bytes = disk_used_;
  return s;
}

std::string PrefixStore::describe() const {
  std::lock_guard<std::mutex> lock(m_);
  const auto gib = [](uint64_t b) { return fmt::format("{:.2f} GiB", b / 1073741824.0); };
  std::string disk =
      disk_ ? fmt::format("{} ({} of {} in {} snapshot{})", o_.dir, gib(disk_used_),
                          gib(o_.disk_bytes), files_.size(), files_.size() == 1 ? "" : "s")
            : "none";
  return fmt::format("[state cache] RAM {}, disk {}", gib(o_.ram_bytes), disk);
}

}  // namespace deltafin
