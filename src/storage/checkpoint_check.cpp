#include "storage/checkpoint_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "core/error.h"
#include "core/fault_inject.h"
#include "core/file_io.h"
#include "core/json_parse.h"
#include "core/mapped_file.h"
#include "core/timer.h"
#include "storage/checkpoint.h"

namespace deltafin {

namespace fs = std::filesystem;

namespace {

// "a, b, c and 4 more"
std::string some(const std::vector<std::string>& names, size_t shown = 3) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < shown; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > shown) s += fmt::format(" and {} more", names.size() - shown);
  return s;
}

// Reads the shard's header and parses it; fills size, expected_size and header_ok.
std::vector<TensorInfo> read_header(const std::string& path, ShardCheck& sc,
                                    std::vector<std::string>& problems) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    problems.push_back(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    return {};
  }
  std::unique_ptr<int, void (*)(int*)> closer(new int(fd), [](int* p) {
    ::close(*p);
    delete p;
  });
  uint8_t len_bytes[8];
  if (read_at(fd, len_bytes, 8, 0).bytes != 8) {
    problems.push_back(fmt::format(
        "{}: {} bytes, too short for a safetensors file (expected an 8-byte header length first)",
        path, sc.size));
    return {};
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, len_bytes, 8);
  if (header_len > kMaxHeaderBytes || header_len > sc.size - 8) {
    problems.push_back(fmt::format(
        "{}: the header length field says {} bytes, {} (the file is truncated or not "
        "safetensors)",
        path, header_len,
        header_len > kMaxHeaderBytes ? "more than any real header"
                                     : fmt::format("past the end of the {}-byte file", sc.size)));
    return {};
  }
  std::vector<uint8_t> header(static_cast<size_t>(header_len));
  const ReadResult r = read_at(fd, header.data(), header_len, 8);
  if (r.bytes != header_len) {
    problems.push_back(fmt::format("{}: cannot read its {}-byte header: {}", path, header_len,
                                   r.error ? std::strerror(r.error) : "the file ends first"));
    return {};
  }
  try {
    // The data region's size is what the header decides; the file's size is checked after.
    auto tensors = parse_safetensors_json(header.data(), header_len, uint64_t{1} << 60, path);
    uint64_t end = 8 + header_len;
    for (const auto& t : tensors) end = std::max(end, t.offset + t.nbytes);
    sc.expected_size = end;
    sc.header_ok = true;
    return tensors;
  } catch (const std::exception& e) {
    problems.push_back(json_error_text(e));
  }
  return {};
}

}  // namespace

CheckpointCheck check_checkpoint_files(const std::string& dir) {
  CheckpointCheck c;
  c.dir = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail_setting("model", dir, "not a folder (expected a checkpoint folder)");
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor -> file
  std::vector<std::string> files;
  if (fs::exists(index, ec)) {
    try {
      const auto j = parse_json(read_file(index.string()), index.string());
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
        fail("{}: expected an object with a \"weight_map\" of tensor -> shard file",
             index.string());
      std::set<std::string> seen;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string())
          fail("{}: weight_map[\"{}\"] is not a file name", index.string(), it.key());
        const std::string f = it.value().get<std::string>();
        if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
          fail("{}: weight_map[\"{}\"] = \"{}\" is not a plain file name", index.string(), it.key(),
               f);
        weight_map[it.key()] = f;
        if (seen.insert(f).second) files.push_back(f);
      }
      if (files.empty()) fail("{}: weight_map is empty", index.string());
    } catch (const std::exception& e) {
      c.problems.push_back(json_error_text(e));
      return c;
    }
  } else if (fs::exists(fs::path(dir) / "model.safetensors", ec)) {
    files.push_back("model.safetensors");
  } else {
    c.problems.push_back(fmt::format(
        "{}: no model.safetensors.index.json and no model.safetensors (not a checkpoint folder)",
        dir));
    return c;
  }
  std::sort(files.begin(), files.end());
  std::map<std::string, std::vector<std::string>> listed;  // file -> tensors the index puts there
  for (const auto& [t, f] : weight_map) listed[f].push_back(t);
  for (const auto& f : files) {
    ShardCheck sc;
    sc.file = f;
    const std::string path = (fs::path(dir) / f).string();
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
      const auto& names = listed[f];
      c.problems.push_back(names.empty()
                               ? fmt::format("{}: missing", path)
                               : fmt::format("{}: missing (the index puts {} tensors in it: {})",
                                             path, names.size(), some(names)));
      c.shards.push_back(sc);
      continue;
    }
    if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
      c.problems.push_back(fmt::format("{}: not a regular file", path));
      c.shards.push_back(sc);
      continue;
    }
    sc.present = true;
    sc.size = static_cast<uint64_t>(fs::file_size(path, ec));
    auto tensors = read_header(path, sc, c.problems);
    if (sc.header_ok && sc.size != sc.expected_size) {
      c.problems.push_back(
          sc.size < sc.expected_size
              ? fmt::format("{}: {} bytes, but its header implies {}: truncated ({} bytes missing)",
                            path, sc.size, sc.expected_size, sc.expected_size - sc.size)
              : fmt::format("{}: {} bytes, but its header implies {} ({} bytes too many)", path,
                            sc.size, sc.expected_size, sc.size - sc.expected_size));
    }
    const int shard = static_cast<int>(c.shards.size());
    for (auto& t : tensors) {
      t.shard = shard;
      const std::string name = t.name;
      if (!c.tensors.emplace(name, std::move(t)).second)
        c.problems.push_back(
            fmt::format("{}: tensor {} also appears in another shard", path, name));
    }
    c.shards.push_back(sc);
  }
  // The index against the headers.
  if (!weight_map.empty()) {
    std::vector<std::string> absent, elsewhere, unlisted;
    for (const auto& [t, f] : weight_map) {
      auto it = c.tensors.find(t);
      if (it == c.tensors.end()) {
        const auto s = std::find_if(c.shards.begin(), c.shards.end(),
                                    [&file = f](const ShardCheck& x) { return x.file == file; });
        if (s != c.shards.end() && s->header_ok) absent.push_back(t);
      } else if (c.shards[static_cast<size_t>(it->second.shard)].file != f) {
        elsewhere.push_back(t);
      }
    }
    for (const auto& [t, info] : c.tensors)
      if (!weight_map.count(t)) unlisted.push_back(t);
    if (!absent.empty())
      c.problems.push_back(fmt::format("{}: {} tensors are not in the shard the index names: {}",
                                       index.string(), absent.size(), some(absent)));
    if (!elsewhere.empty())
      c.problems.push_back(fmt::format("{}: {} tensors are in another shard than it names: {}",
                                       index.string(), elsewhere.size(), some(elsewhere)));
    if (!unlisted.empty())
      c.problems.push_back(fmt::format("{}: {} tensors of the shards are not in its weight_map: {}",
                                       index.string(), unlisted.size(), some(unlisted)));
  }
  return c;
}

void verify_checkpoint_bytes(
    CheckpointCheck& c, uint64_t chunk,
    const std::function<void(size_t, uint64_t, const uint8_t*, size_t)>& on_bytes,
    const std::function<void(uint64_t, uint64_t)>& progress) {
  Stopwatch sw;
  chunk = std::max(kIoAlign, io_align_down(chunk));
  uint64_t total = 0, done = 0;
  for (const auto& s : c.shards) total += s.present ? s.size : 0;
  void* raw = nullptr;
  if (::posix_memalign(&raw, kIoAlign, chunk) != 0) throw std::bad_alloc();
  std::unique_ptr<void, void (*)(void*)> buf(raw, std::free);
  auto* bytes = static_cast<uint8_t*>(raw);
  for (size_t i = 0; i < c.shards.size(); ++i) {
    const ShardCheck& s = c.shards[i];
    if (!s.present) continue;
    const std::string path = (fs::path(c.dir) / s.file).string();
    int fd = -1;
    try {
      fd = open_for_reading(path, true);  // O_DIRECT: the disk's bytes, not the page cache's
    } catch (const std::exception& e) {
      c.unreadable.push_back({s.file, 0, s.size, e.what(), {}});
      continue;
    }
    for (uint64_t off = 0; off < s.size; off += chunk) {
      const uint64_t want = std::min(chunk, s.size - off);
      std::string error;
      uint64_t got = 0;
      for (int attempt = 0; attempt < 2; ++attempt) {
        ReadFault fault;
        if (faults_enabled()) fault = read_fault("verify", path);
        if (fault.kind == FaultKind::eio) {
          error = std::strerror(EIO);
          continue;
        }
        const ReadResult r = read_at(fd, bytes, io_align_up(want), off);
        got = std::min(r.bytes, want);
        if (fault.kind == FaultKind::short_read || fault.kind == FaultKind::shrink) got = want / 2;
        if (got == want) break;
        error = r.error ? std::strerror(r.error) : "the file ended early";
      }
      if (got == want) {
        if (on_bytes) on_bytes(i, off, bytes, static_cast<size_t>(want));
      } else {
        UnreadableRegion* last = c.unreadable.empty() ? nullptr : &c.unreadable.back();
        if (last != nullptr && last->file == s.file && last->offset + last->length == off) {
          last->length += want;
        } else {
          c.unreadable.push_back({s.file, off, want, error, {}});
        }
      }
      done += want;
      if (progress) progress(done, total);
    }
    ::close(fd);
  }
  // Name the tensors each region holds.
  for (auto& r : c.unreadable) {
    for (const auto& [name, t] : c.tensors) {
      const ShardCheck& s = c.shards[static_cast<size_t>(t.shard)];
      if (s.file == r.file && t.offset < r.offset + r.length && t.offset + t.nbytes > r.offset)
        r.tensors.push_back(name);
    }
  }
  c.bytes_verified = done;
  c.verified = true;
  c.verify_seconds = sw.elapsed();
}

}  // namespace deltafin
