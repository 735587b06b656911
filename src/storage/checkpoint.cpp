#include "storage/checkpoint.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/json_parse.h"

namespace deltafin {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<TensorInfo> parse_safetensors_header(const uint8_t* data, uint64_t size,
                                                 const std::string& file) {
  if (size < 8) {
    fail("{}: truncated safetensors file ({} bytes; expected an 8-byte header length first)", file,
         size);
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, data, 8);  // little-endian on every supported platform
  if (header_len > size - 8) {
    fail(
        "{}: safetensors header length {} points past the end of the file ({} bytes); the file "
        "is truncated or not a safetensors file",
        file, header_len, size);
  }
  auto out = parse_safetensors_json(data + 8, header_len, size - 8 - header_len, file);
  for (auto& t : out) t.data = data + t.offset;
  return out;
}

std::vector<TensorInfo> parse_safetensors_json(const uint8_t* header_bytes, uint64_t header_len,
                                               uint64_t data_size, const std::string& file) {
  if (header_len > kMaxHeaderBytes) {
    fail("{}: safetensors header of {} bytes is implausibly large (limit {} MiB)", file, header_len,
         kMaxHeaderBytes >> 20);
  }
  json header;
  check_json_depth(std::string_view(reinterpret_cast<const char*>(header_bytes),
                                    static_cast<size_t>(header_len)),
                   kMaxJsonDepth, file + ": safetensors header");
  try {
    header = json::parse(reinterpret_cast<const char*>(header_bytes),
                         reinterpret_cast<const char*>(header_bytes + header_len));
  } catch (const json::exception& e) {  // parse errors, and numbers beyond a double (fuzzer)
    fail("{}: safetensors header is not valid JSON: {}", file, json_error_text(e));
  }
  if (!header.is_object()) fail("{}: safetensors header is not a JSON object", file);

  const uint64_t data_start = 8 + header_len;
  // What a header may claim (SECURITY.md lists these): far above any real checkpoint's shard
  // (K3's hold a few thousand tensors with names under 100 bytes and at most 3 dimensions).
  const size_t n_tensors = header.size() - (header.contains("__metadata__") ? 1 : 0);
  if (n_tensors > kMaxTensorsPerShard) {
    fail("{}: safetensors header lists {} tensors (limit {} tensors per file)", file, n_tensors,
         kMaxTensorsPerShard);
  }
  std::vector<TensorInfo> out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const json& e = it.value();
    const std::string& name = it.key();
    if (name.empty() || name.size() > kMaxTensorNameBytes) {
      fail("{}: a tensor name of {} bytes (expected 1 to {})", file, name.size(),
           kMaxTensorNameBytes);
    }
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets")) {
      fail("{}: tensor {}: header entry needs dtype, shape and data_offsets, found {}", file, name,
           e.dump());
    }
    TensorInfo t;
    t.name = name;
    if (!e["dtype"].is_string()) fail("{}: tensor {}: dtype is not a string", file, name);
    auto dt = parse_dtype(e["dtype"].get<std::string>());
    if (!dt) {
      fail(
          "{}: tensor {}: unknown dtype {} (expected one of F64, F32, F16, BF16, I64, I32, I16, "
          "I8, "
          "U8, BOOL)",
          file, name, e["dtype"].dump());
    }
    t.dtype = *dt;
    if (!e["shape"].is_array()) fail("{}: tensor {}: shape is not a list", file, name);
    if (e["shape"].size() > kMaxTensorRank) {
      fail("{}: tensor {}: shape has {} dimensions (limit {})", file, name, e["shape"].size(),
           kMaxTensorRank);
    }
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        fail("{}: tensor {}: bad shape {}", file, name, e["shape"].dump());
      }
      t.shape.push_back(d.get<int64_t>());
    }
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      fail("{}: tensor {}: data_offsets must be two non-negative integers, found {}", file, name,
           off.dump());
    }
    uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (en < b) fail("{}: tensor {}: data_offsets [{}, {}] run backwards", file, name, b, en);
    if (en > data_size) {
      fail(
          "{}: tensor {}: data [{}, {}) points outside the file's data region ({} bytes); the "
          "shard is truncated or its header is corrupt",
          file, name, b, en, data_size);
    }
    // The element count is a product of header values: check it for overflow before using it.
    uint64_t bytes = dtype_size(t.dtype);
    bool too_big = false;
    for (const int64_t d : t.shape) {
      too_big = too_big || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes);
    }
    if (too_big || bytes > data_size) {
      fail(
          "{}: tensor {}: {} {} needs more bytes than the file's data region holds ({} bytes); "
          "the shape is corrupt",
          file, name, dtype_name(t.dtype), t.shape_string(), data_size);
    }
    const uint64_t expect = bytes;
    if (en - b != expect) {
      fail("{}: tensor {}: {} {} needs {} bytes but data_offsets give {}", file, name,
           dtype_name(t.dtype), t.shape_string(), expect, en - b);
    }
    t.offset = data_start + b;
    t.nbytes = en - b;
    out.push_back(std::move(t));
  }
  // No two tensors may share bytes.
  std::vector<const TensorInfo*> sorted;
  for (const auto& t : out) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    const TensorInfo* prev = sorted[i - 1];
    if (sorted[i]->nbytes > 0 && prev->offset + prev->nbytes > sorted[i]->offset) {
      fail("{}: tensors {} and {} overlap in the file", file, prev->name, sorted[i]->name);
    }
  }
  return out;
}

void Checkpoint::add_shard(const std::string& file_name) {
  fs::path p = fs::path(dir_) / file_name;
  if (!fs::exists(p)) fail("{}: shard file is missing", p.string());
  shards_.emplace_back(p.string());
  const MappedFile& mf = shards_.back();
  int index = static_cast<int>(shards_.size() - 1);
  for (auto& t : parse_safetensors_header(mf.data(), mf.size(), mf.path())) {
    t.shard = index;
    std::string name = t.name;
    auto [it, inserted] = tensors_.emplace(name, std::move(t));
    if (!inserted) {
      fail("{}: tensor {} also appears in {}", mf.path(), name, shards_[it->second.shard].path());
    }
  }
}

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  auto ck = std::unique_ptr<Checkpoint>(new Checkpoint());
  ck->dir_ = dir;
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index)) {
    const json j = parse_json(read_regular_file(index.string()), index.string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      fail("{}: expected an object with a \"weight_map\" of tensor name -> shard file",
           index.string());
    }
    const json& wm = j["weight_map"];
    std::vector<std::string> files;
    std::set<std::string> seen;
    for (auto it = wm.begin(); it != wm.end(); ++it) {
      if (!it.value().is_string()) {
        fail("{}: weight_map[\"{}\"] is not a file name", index.string(), it.key());
      }
      std::string f = it.value().get<std::string>();
      if (f.find('/') != std::string::npos || f.find("..") != std::string::npos) {
        fail("{}: weight_map[\"{}\"] = \"{}\" is not a plain file name in the model folder",
             index.string(), it.key(), f);
      }
      if (seen.insert(f).second) files.push_back(f);
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) fail("{}: weight_map is empty", index.string());
    for (const auto& f : files) ck->add_shard(f);
    // Every tensor the index names must be in the shard it names.
    for (auto it = wm.begin(); it != wm.end(); ++it) {
      const TensorInfo* t = ck->find(it.key());
      std::string f = it.value().get<std::string>();
      if (t == nullptr) {
        fail("{}: tensor {} is listed in weight_map for {} but that shard does not contain it",
             index.string(), it.key(), f);
      }
      if (fs::path(ck->shards_[t->shard].path()).filename() != f) {
        fail("{}: tensor {} is listed for {} but found in {}", index.string(), it.key(), f,
             ck->shards_[t->shard].path());
      }
    }
  } else if (fs::exists(single)) {
    ck->add_shard("model.safetensors");
  } else {
    fail(
        "{}: no model.safetensors or model.safetensors.index.json (expected the checkpoint's "
        "safetensors files next to config.json)",
        dir);
  }
  return ck;
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorInfo& Checkpoint::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) fail("{}: tensor {} not found", dir_, name);
  return *t;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& s : shards_) n += s.size();
  return n;
}

ModelConfig load_config(const std::string& model_dir) {
  namespace fs = std::filesystem;
  fs::path p = fs::path(model_dir) / "config.json";
  if (!fs::exists(p)) {
    fail(
        "{}: no config.json (expected a Kimi K3 checkpoint folder: config.json plus "
        "model.safetensors or model.safetensors.index.json with its shards)",
        model_dir);
  }
  return parse_config(read_regular_file(p.string()), p.string());
}

}  // namespace deltafin
