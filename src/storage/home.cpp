#include "storage/home.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/checksum.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/json_parse.h"
#include "core/mapped_file.h"
#include "storage/checkpoint.h"
#include "storage/expert_directory.h"

namespace deltafin {

namespace fs = std::filesystem;

std::string home_layer_file(int layer) {
  return fmt::format("layer-{:03d}.bin", layer);
}

uint64_t expert_checksum(const ExpertLocation& loc, const uint8_t* image) {
  if (loc.contiguous()) return checksum64(image + loc.tensor_pos.front(), loc.bytes);
  std::vector<uint64_t> each;
  for (size_t i = 0; i < loc.ranges.size(); ++i)
    each.push_back(checksum64(image + loc.tensor_pos[i], loc.ranges[i].size));
  return checksum64(each.data(), each.size() * sizeof(uint64_t));
}

bool same_expert_bytes(const ExpertLocation& loc, const uint8_t* a, const uint8_t* b,
                       uint64_t begin, uint64_t end) {
  for (size_t i = 0; i < loc.ranges.size(); ++i) {
    const uint64_t lo = std::max(begin, loc.tensor_pos[i]);
    const uint64_t hi = std::min(end, loc.tensor_pos[i] + loc.ranges[i].size);
    if (lo < hi && std::memcmp(a + lo, b + lo, hi - lo) != 0) return false;
  }
  return true;
}

std::string HomeManifest::to_json() const {
  nlohmann::json j;
  j["format"] = kHomeFormat;
  j["checkpoint"] = checkpoint;
  j["placement"] = placement;
  j["args"] = args;
  j["model"] = model;
  j["probe_bytes_per_s"] = probe_bytes_per_s;
  j["model_probe_bytes_per_s"] = model_probe_bytes_per_s;
  nlohmann::json list = nlohmann::json::array();
  for (const auto& e : experts)
    list.push_back({e.layer, e.expert, e.offset, e.bytes, checksum_hex(e.checksum)});
  j["experts"] = std::move(list);
  j["superseded"] = superseded;
  return j.dump(1) + "\n";
}

HomeManifest HomeManifest::parse(const std::string& text, const std::string& what) {
  const nlohmann::json j = parse_json(text, what);
  auto str = [&](const char* key) -> std::string {
    if (!j.is_object() || !j.contains(key) || !j[key].is_string())
      fail_arg("{}: \"{}\" is missing or not a string", what, key);
    return j[key].get<std::string>();
  };
  auto num = [&](const char* key) -> double {
    if (!j.contains(key) || !j[key].is_number())
      fail_arg("{}: \"{}\" is missing or not a number", what, key);
    return j[key].get<double>();
  };
  if (str("format") != kHomeFormat)
    fail_arg(
        "{}: format \"{}\" is not {} (written by another version of deltafin: run deltafin "
        "place again)",
        what, str("format"), kHomeFormat);
  HomeManifest m;
  m.checkpoint = str("checkpoint");
  m.placement = str("placement");
  m.args = str("args");
  m.model = str("model");
  m.probe_bytes_per_s = num("probe_bytes_per_s");
  m.model_probe_bytes_per_s = num("model_probe_bytes_per_s");
  if (m.placement.empty() || m.placement.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail_arg("{}: placement \"{}\" is not an ID of hex digits", what, m.placement);
  if (!j.contains("experts") || !j["experts"].is_array())
    fail_arg("{}: \"experts\" is missing or not a list", what);
  for (const auto& e : j["experts"]) {
    HomeEntry h;
    if (!e.is_array() || e.size() != 5 || !e[0].is_number_unsigned() ||
        !e[1].is_number_unsigned() || !e[2].is_number_unsigned() || !e[3].is_number_unsigned() ||
        !e[4].is_string() || !parse_checksum_hex(e[4].get<std::string>(), &h.checksum)) {
      fail_arg("{}: an expert entry is {} (expected [layer, expert, offset, bytes, checksum])",
               what, e.dump());
    }
    h.layer = e[0].get<int>();
    h.expert = e[1].get<int>();
    h.offset = e[2].get<uint64_t>();
    h.bytes = e[3].get<uint64_t>();
    m.experts.push_back(h);
  }
  if (j.contains("superseded")) {  // absent in manifests written before it was recorded
    if (!j["superseded"].is_array())
      fail_arg("{}: \"superseded\" is not a list of folder names", what);
    for (const auto& n : j["superseded"]) {
      if (!n.is_string() || !is_place_folder_name(n.get<std::string>()))
        fail_arg("{}: \"superseded\" holds {} (expected names like data-ID or data-ID.partial)",
                 what, n.dump());
      m.superseded.push_back(n.get<std::string>());
    }
  }
  return m;
}

bool is_place_folder_name(const std::string& name) {
  std::string id = name;
  if (!id.starts_with("data-")) return false;
  id.erase(0, 5);
  if (id.ends_with(".partial")) id.resize(id.size() - 8);
  return !id.empty() && id.size() <= 32 &&
         id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::vector<std::string> home_folders_made(const std::string& home) {
  std::vector<std::string> out;
  try {
    const std::string path = home + "/" + kHomeManifestName;
    const nlohmann::json j = parse_json(read_regular_file(path), path);
    if (!j.is_object()) return out;
    if (j.contains("placement") && j["placement"].is_string() &&
        is_place_folder_name("data-" + j["placement"].get<std::string>()))
      out.push_back("data-" + j["placement"].get<std::string>());
    if (j.contains("superseded") && j["superseded"].is_array()) {
      for (const auto& n : j["superseded"]) {
        if (n.is_string() && is_place_folder_name(n.get<std::string>()))
          out.push_back(n.get<std::string>());
      }
    }
  } catch (const std::exception&) {
    out.clear();  // no manifest, or not one we can read: nothing is known to be ours
  }
  return out;
}

HomeManifest read_home_manifest(const std::string& home) {
  std::error_code ec;
  if (!fs::is_directory(home, ec)) fail_io("{} is not a folder (missing or not mounted)", home);
  const std::string path = home + "/" + kHomeManifestName;
  if (!fs::exists(path, ec))
    fail_io("{} has no {} (run deltafin place to fill it)", home, kHomeManifestName);
  return HomeManifest::parse(read_regular_file(path), path);
}

std::vector<std::string> home_data_files(const std::string& home) {
  std::vector<std::string> out;
  try {
    const HomeManifest m = read_home_manifest(home);
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(home + "/" + m.data_dir(), ec)) {
      if (f.path().filename().string().rfind("layer-", 0) == 0) out.push_back(f.path().string());
    }
  } catch (const Error&) {
    out.clear();
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// Appends `n` bytes at `offset` of `fd` to `out` (fewer at the end of the file).
void append_range(int fd, uint64_t offset, uint64_t n, const std::string& path, std::string& out) {
  std::string buf(n, '\0');
  const ReadResult r = read_at(fd, buf.data(), n, offset);
  if (r.error != 0) fail_io("cannot read {}: {}", path, std::strerror(r.error));
  out.append(buf.data(), r.bytes);
}

}  // namespace

std::string checkpoint_fingerprint(const Checkpoint& ck) {
  std::string text = read_file(ck.dir() + "/config.json");
  for (const auto& shard : ck.shards()) {
    const std::string& path = shard.path();
    const uint64_t size = shard.size();
    text += fmt::format("\n{} {}\n", fs::path(path).filename().string(), size);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail_io("cannot open {}: {}", path, std::strerror(errno));
    try {
      uint64_t header = 0;
      if (read_at(fd, &header, 8, 0).bytes == 8 && header <= kMaxHeaderBytes)
        append_range(fd, 0, 8 + header, path, text);
      constexpr uint64_t kSample = 64 << 10;
      for (uint64_t q = 1; q <= 3; ++q)
        append_range(fd, io_align_down(size * q / 4), kSample, path, text);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  }
  return checksum_hex(checksum64(text.data(), text.size()));
}

ExpertHome::ExpertHome(std::string dir, const std::string& fingerprint,
                       const ExpertDirectory& experts, bool direct_io)
    : dir_(std::move(dir)), manifest_(read_home_manifest(dir_)), experts_(experts) {
  if (manifest_.checkpoint != fingerprint) {
    fail_io(
        "{} holds experts of another checkpoint (placed from {}; this model's files differ): run "
        "deltafin place again",
        dir_, manifest_.model);
  }
  first_moe_ = experts.first_moe_layer();
  num_experts_ = experts.num_experts();
  const int moe_layers = experts.num_layers() - first_moe_;
  index_.assign(static_cast<size_t>(moe_layers * num_experts_), -1);
  files_.resize(static_cast<size_t>(std::max(0, moe_layers)));
  std::vector<uint64_t> file_need(files_.size(), 0);
  for (size_t i = 0; i < manifest_.experts.size(); ++i) {
    const HomeEntry& e = manifest_.experts[i];
    if (e.layer < first_moe_ || e.layer >= experts.num_layers() || e.expert < 0 ||
        e.expert >= num_experts_) {
      fail_io("{}: entry for expert {} of layer {} does not fit this model", dir_, e.expert,
              e.layer);
    }
    if (e.bytes != experts.location(e.layer, e.expert).bytes || e.offset % kIoAlign != 0) {
      fail_io(
          "{}: entry for expert {} of layer {} has {} bytes at offset {} (expected {} bytes "
          "on the 4 KiB grid)",
          dir_, e.expert, e.layer, e.bytes, e.offset, experts.location(e.layer, e.expert).bytes);
    }
    const size_t l = static_cast<size_t>(e.layer - first_moe_);
    index_[l * static_cast<size_t>(num_experts_) + static_cast<size_t>(e.expert)] =
        static_cast<int>(i);
    file_need[l] =
        std::max(file_need[l], e.offset + experts.location(e.layer, e.expert).image_bytes);
  }
  const std::string data = dir_ + "/" + manifest_.data_dir();
  for (size_t l = 0; l < files_.size(); ++l) {
    if (file_need[l] == 0) continue;
    const std::string path = data + "/" + home_layer_file(first_moe_ + static_cast<int>(l));
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec) fail_io("{}: data file {} is missing: run deltafin place again", dir_, path);
    if (size < file_need[l])
      fail_io("{}: data file {} has {} bytes, the manifest needs {}: run deltafin place again",
              dir_, path, size, file_need[l]);
    files_[l] = std::make_unique<DirectFile>(path, direct_io);
  }
}

ExpertHome::~ExpertHome() = default;

const HomeEntry* ExpertHome::find(int layer, int expert) const {
  if (layer < first_moe_ || expert < 0 || expert >= num_experts_) return nullptr;
  const size_t i = static_cast<size_t>(layer - first_moe_) * static_cast<size_t>(num_experts_) +
                   static_cast<size_t>(expert);
  if (i >= index_.size() || index_[i] < 0) return nullptr;
  return &manifest_.experts[static_cast<size_t>(index_[i])];
}

const std::string& ExpertHome::file_of(const HomeEntry& e) const {
  return files_[static_cast<size_t>(e.layer - first_moe_)]->path();
}

void ExpertHome::read_piece(const HomeEntry& e, uint64_t begin, uint64_t end, uint8_t* image,
                            const std::string& what) const {
  const DirectFile& f = *files_[static_cast<size_t>(e.layer - first_moe_)];
  f.read_aligned(e.offset + begin, end - begin, image + begin, end - begin, what);
}

void ExpertHome::check(const HomeEntry& e, const uint8_t* image, const std::string& what) const {
  const uint64_t got = expert_checksum(experts_.location(e.layer, e.expert), image);
  if (got != e.checksum) {
    fail_io("checksum of {} in {} at offset {} is {}, the manifest says {} (the copy is damaged)",
            what, file_of(e), e.offset, checksum_hex(got), checksum_hex(e.checksum));
  }
}

void ExpertHome::read(const HomeEntry& e, uint8_t* image, const std::string& what) const {
  read_piece(e, 0, experts_.location(e.layer, e.expert).image_bytes, image, what);
  check(e, image, what);
}

bool ExpertHome::direct() const {
  for (const auto& f : files_) {
    if (f && !f->direct()) return false;
  }
  return true;
}

}  // namespace deltafin
