// The built-in demo model: a tiny K3 trained on English text (tools/train/), shipped inside the
// binary as a gzip-compressed ustar archive (assets/demo/k3-demo.tar.gz, embedded by
// demo_archive.cpp) so that `deltafin run` with no --model works from any folder, offline.
// On first use the archive is unpacked into the cache folder; a stamp file holding the
// archive's CRC-32 is written last, so an interrupted install or an older archive is redone
// instead of being trusted. Its vision tower and projector (tools/demo_vision.sh) are random, so
// images run through the whole path by default; demo.json's "vision" sentence says so in the
// notice. gzip and tar are read with zlib and a few lines of ustar parsing
// (standard formats: `tar tzf` lists the shipped file) rather than a new dependency.
#include "cli/demo.h"

#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "cli/common.h"
#include "core/error.h"

extern "C" const unsigned char deltafin_demo_begin[];
extern "C" const unsigned char deltafin_demo_end[];

namespace deltafin::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kStamp = ".deltafin-demo";

std::string_view archive() {
  return {reinterpret_cast<const char*>(deltafin_demo_begin),
          static_cast<size_t>(deltafin_demo_end - deltafin_demo_begin)};
}

std::string archive_id(std::string_view a) {
  const uLong crc =
      crc32(0L, reinterpret_cast<const Bytef*>(a.data()), static_cast<uInt>(a.size()));
  return fmt::format("{:08x}-{}", crc, a.size());
}

std::string gunzip(std::string_view in) {
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) fail("demo model: zlib cannot start");
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  std::string out;
  char buf[1 << 16];
  int rc = Z_OK;
  while (rc == Z_OK) {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    rc = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof buf - zs.avail_out);
  }
  inflateEnd(&zs);
  if (rc != Z_STREAM_END)
    fail("demo model: the embedded archive is not valid gzip (zlib error {})", rc);
  return out;
}

uint64_t octal(std::string_view field) {
  uint64_t v = 0;
  for (const char c : field) {
    if (c == '\0' || c == ' ') break;
    if (c < '0' || c > '7') fail("demo model: bad size field in the embedded tar archive");
    v = v * 8 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

void write_file(const fs::path& path, std::string_view data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.flush();
  if (!out) fail("demo model: cannot write {}", path.string());
}

// Unpacks the regular files of a ustar archive into dir: flat names, plus the files of one
// draft/ subfolder (the demo's drafter, which `--draft` uses by default).
void untar(const std::string& tar, const fs::path& dir) {
  size_t pos = 0;
  while (pos + 512 <= tar.size()) {
    const std::string_view h(tar.data() + pos, 512);
    if (h.find_first_not_of('\0') == std::string_view::npos) return;  // end-of-archive block
    const std::string name(h.substr(0, h.substr(0, 100).find('\0')));
    const uint64_t size = octal(h.substr(124, 12));
    const char type = h[156];
    pos += 512;
    if (pos + size > tar.size()) fail("demo model: the embedded tar archive is truncated");
    if (type == '0' || type == '\0') {
      const bool draft = name.rfind("draft/", 0) == 0;
      const std::string file = draft ? name.substr(6) : name;
      if (file.empty() || file.find('/') != std::string::npos || file[0] == '.')
        fail("demo model: unexpected entry '{}' in the embedded archive", name);
      std::error_code ec;  // a folder that cannot be made fails in write_file, naming the file
      if (draft) fs::create_directories(dir / "draft", ec);
      write_file(dir / name, std::string_view(tar.data() + pos, size));
    }
    pos += (size + 511) / 512 * 512;
  }
  fail("demo model: the embedded tar archive has no end marker");
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

std::string install_demo_model() {
  const fs::path dir = fs::path(cache_dir()) / "demo-k3-english";
  const std::string id = archive_id(archive());
  std::error_code ec;
  if (!fs::exists(dir / kStamp, ec) || slurp(dir / kStamp) != id) {
    fs::create_directories(dir.parent_path(), ec);
    if (ec) fail("cannot create the cache folder {}: {}", dir.parent_path().string(), ec.message());
    const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) fail("cannot create {}: {}", tmp.string(), ec.message());
    untar(gunzip(archive()), tmp);
    write_file(tmp / kStamp, id);
    fs::remove_all(dir, ec);  // an interrupted install or an older demo
    fs::rename(tmp, dir, ec);
    if (ec && !fs::exists(dir / kStamp)) {  // another process may have won the race
      fs::remove_all(tmp, ec);
      fail("cannot move the demo model into place at {}: {}", dir.string(), ec.message());
    }
    fs::remove_all(tmp, ec);
  }
  std::string about;
  try {
    const auto j = nlohmann::json::parse(slurp(dir / "demo.json"));
    about = j.at("about").get<std::string>();
    if (j.contains("vision") && j["vision"].is_string())
      about += "; " + j["vision"].get<std::string>();
  } catch (const std::exception&) {
    fail(
        "demo model at {}: demo.json is missing or has no \"about\" text; delete the folder to "
        "reinstall it",
        dir.string());
  }
  fmt::print(stderr,
             "note: no --model given, using the built-in demo at {}: {}. For real weights, "
             "fetch them with `deltafin pull moonshotai/Kimi-K3` and pass --model DIR or set "
             "DELTAFIN_MODEL.\n",
             dir.string(), about);
  return dir.string();
}

std::string demo_drafter_note(const std::string& model_dir, const std::string& draft) {
  const fs::path dir(model_dir);
  std::error_code ec;
  if (!fs::exists(dir / kStamp, ec) || fs::path(draft) != dir / "draft") return "";
  try {
    const auto j = nlohmann::json::parse(slurp(dir / "demo.json"));
    if (!j.contains("drafter") || !j["drafter"].is_string()) return "";
    return fmt::format(
        "note: the demo drafts with {} (the output is the same; --draft none "
        "turns it off)",
        j["drafter"].get<std::string>());
  } catch (const std::exception&) {
    return "";  // install_demo_model checked demo.json; a note is not worth failing for
  }
}

}  // namespace deltafin::cli
