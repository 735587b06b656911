// The checks of the hub's answers (hub_listing.h). Written against nlohmann::json with explicit
// type tests before every read, because json::value() and get<>() throw the library's own
// exceptions on a wrong type, and a hostile listing may only ever produce a deltafin::Error
// (the fuzz target's contract). Paths and ids reach messages through hub_quote only, so a
// listing cannot write control characters to the terminal.
#include "cli/hub_listing.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_parse.h"

namespace deltafin::cli {

namespace {

// `s` in lowercase when it is exactly `n` hex digits; "" otherwise.
std::string hex_id(const std::string& s, size_t n) {
  if (s.size() != n) return "";
  std::string out = s;
  for (char& ch : out) {
    if (ch >= 'A' && ch <= 'F') ch = static_cast<char>(ch - 'A' + 'a');
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return "";
  }
  return out;
}

// A member's text for a message: a string quoted, anything else as its JSON type.
std::string shown(const nlohmann::json& v) {
  if (v.is_string()) return hub_quote(v.get_ref<const std::string&>());
  return json_type_name(v.type());
}

}  // namespace

std::string hub_quote(std::string_view s) {
  std::string out = "\"";
  size_t n = 0;
  for (unsigned char ch : s) {
    if (++n > 160) {
      out += "...";
      break;
    }
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch >= 0x20 && ch < 0x7f) {
      out += static_cast<char>(ch);
    } else {
      out += fmt::format("\\x{:02x}", ch);
    }
  }
  return out + "\"";
}

void check_repo_path(const std::string& path) {
  bool ok = !path.empty() && path.size() < 4096 && path.front() != '/';
  for (unsigned char ch : path) ok = ok && ch >= 0x20 && ch != 0x7f && ch != '\\';
  size_t b = 0;
  while (ok && b <= path.size()) {
    const size_t e = std::min(path.find('/', b), path.size());
    const std::string_view part(path.data() + b, e - b);
    ok = !part.empty() && part != "." && part != "..";
    b = e + 1;
  }
  if (!ok)
    fail(
        "the hub listed a file path {} that is not a plain relative path (expected names "
        "separated by '/', without \".\", \"..\", a backslash or a control character): "
        "refusing it",
        hub_quote(path));
  if (path == ".deltafin-pull" || path.starts_with(".deltafin-pull/"))
    fail(
        "the hub listed a file path {} inside .deltafin-pull, the folder where pull keeps its "
        "own state: refusing it",
        hub_quote(path));
}

std::string parse_revision_commit(std::string_view body, const std::string& what) {
  const nlohmann::json info = parse_json(body, what);
  if (!info.is_object()) fail("{}: expected a JSON object, got {}", what, shown(info));
  const auto sha = info.find("sha");
  if (sha == info.end())
    fail("{}: the hub's answer has no \"sha\" (the commit the revision points to)", what);
  const std::string commit = sha->is_string() ? hex_id(sha->get<std::string>(), 40) : "";
  if (commit.empty())
    fail("{}: the hub answered with commit {}: expected 40 hex digits (a git commit id)", what,
         shown(*sha));
  return commit;
}

void HubListing::add_page(std::string_view body) {
  const std::string what = fmt::format("listing the files of {}", repo_);
  const nlohmann::json items = parse_json(body, what);
  if (!items.is_array()) fail("{}: expected a JSON list of entries, got {}", what, shown(items));
  for (const auto& e : items) {
    if (!e.is_object())
      fail("{}: expected every entry to be a JSON object, got {}", what, shown(e));
    const auto type = e.find("type");
    if (type == e.end() || !type->is_string())
      fail("{}: an entry has no \"type\" string (expected \"file\" or \"directory\")", what);
    if (type->get_ref<const std::string&>() != "file") continue;
    HubFile f;
    const auto path = e.find("path");
    if (path == e.end() || !path->is_string())
      fail("{}: a file entry has no \"path\" string", what);
    f.path = path->get<std::string>();
    check_repo_path(f.path);
    const std::string at = fmt::format("{}: the hub listed file {}", what, hub_quote(f.path));
    auto read_size = [&](const nlohmann::json& obj, const char* key) {
      const auto s = obj.find(key);
      if (s == obj.end() || !s->is_number_unsigned())
        fail("{} with {} {}: expected a size in bytes (a whole number)", at, key,
             s == obj.end() ? "missing" : shown(*s));
      const uint64_t v = s->get<uint64_t>();
      if (v > kMaxHubFileBytes)
        fail("{} with {} {}: expected at most {} bytes (4 TiB) for one file", at, key, v,
             kMaxHubFileBytes);
      return v;
    };
    f.size = read_size(e, "size");
    const auto oid = e.find("oid");
    f.oid = oid != e.end() && oid->is_string() ? hex_id(oid->get<std::string>(), 40) : "";
    if (f.oid.empty())
      fail("{} with oid {}: expected 40 hex digits (its git blob id)", at,
           oid == e.end() ? "missing" : shown(*oid));
    const auto lfs = e.find("lfs");
    if (lfs != e.end() && !lfs->is_null()) {
      if (!lfs->is_object())
        fail("{} with lfs {}: expected an object with the file's sha256 \"oid\" and \"size\"", at,
             shown(*lfs));
      const auto sha = lfs->find("oid");
      f.sha256 = sha != lfs->end() && sha->is_string() ? hex_id(sha->get<std::string>(), 64) : "";
      if (f.sha256.empty())
        fail("{} with lfs.oid {}: expected 64 hex digits (the SHA-256 of its bytes)", at,
             sha == lfs->end() ? "missing" : shown(*sha));
      // The LFS object's size where given (the entry's own "size" may be the pointer's).
      if (lfs->contains("size")) f.size = read_size(*lfs, "size");
    }
    add(std::move(f));
  }
}

void HubListing::add(HubFile f) {
  const std::string what = fmt::format("listing the files of {}", repo_);
  if (files_.size() >= kMaxHubFiles)
    fail("{}: the hub lists more than {} files: expected a model repository", what, kMaxHubFiles);
  if (paths_.count(f.path) != 0)
    fail("{}: the hub listed file {} twice: expected each path once", what, hub_quote(f.path));
  if (folders_.count(f.path) != 0)
    fail("{}: the hub listed {} as a file and as a folder of other files", what, hub_quote(f.path));
  for (size_t slash = f.path.find('/'); slash != std::string::npos;
       slash = f.path.find('/', slash + 1)) {
    const std::string folder = f.path.substr(0, slash);
    if (paths_.count(folder) != 0)
      fail("{}: the hub listed {} as a file and as a folder of other files", what,
           hub_quote(folder));
    folders_.insert(folder);
  }
  paths_.insert(f.path);
  files_.push_back(std::move(f));
}

}  // namespace deltafin::cli
