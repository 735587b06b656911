// What `deltafin pull` believes of the hub's answers, checked before anything uses them: the
// revision's commit id and the tree listing's pages (paths, sizes, git and LFS hashes). Kept
// apart from the HTTP client (hub.*) so that it needs neither libcurl nor a network: the fuzz
// target `hub_listing` (fuzz/fuzz_hub.cpp) runs it on arbitrary bytes, and every build replays
// its kept inputs (FuzzRegression.*).
//
// Everything here is hostile until checked, because the hub's strings become file names, URLs
// and sizes: a path must be a plain relative path outside pull's own state folder, an `oid` must
// be 40 hex digits (a git blob id) and an `lfs.oid` 64 (a SHA-256), both kept in lowercase; a
// size is at most kMaxHubFileBytes; no path is listed twice or both as a file and as a folder;
// and the listing holds at most kMaxHubFiles files. So a listing that passes can neither name a
// file outside the target folder nor make a sum of sizes wrap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace deltafin::cli {

// The largest file a listing may name (4 TiB; the hub's own limit is 50 GB per LFS file).
inline constexpr uint64_t kMaxHubFileBytes = uint64_t{1} << 42;
// The most files a listing may hold (a K3 repository has a few thousand). With the size limit,
// the sum of every listed size stays below 2^62: no sum over a listing can wrap.
inline constexpr size_t kMaxHubFiles = size_t{1} << 20;

struct HubFile {
  std::string path;  // in the repository, '/'-separated (check_repo_path holds)
  uint64_t size = 0;
  std::string oid;     // git blob SHA-1 (of the bytes, or of the LFS pointer): 40 hex digits
  std::string sha256;  // LFS files: SHA-256 of the bytes, 64 hex digits; "" otherwise
};

// `s` quoted for a message: printable ASCII as is, anything else (a NUL, a newline, a byte of a
// multi-byte character) as \xNN, cut after 160 characters.
std::string hub_quote(std::string_view s);

// Throws Error unless a listed path is safe to create under the target folder: relative, no
// "." or ".." component, no empty component, no backslash or control character, at most 4095
// bytes, and not in pull's own state folder (.deltafin-pull).
void check_repo_path(const std::string& path);

// The commit a revision answer (GET /api/models/REPO/revision/REV) pins: its "sha", which must
// be 40 hex digits (returned in lowercase). `what` names the request in the error.
std::string parse_revision_commit(std::string_view body, const std::string& what);

// The files of a repository, one page of the tree listing at a time.
class HubListing {
 public:
  explicit HubListing(std::string repo) : repo_(std::move(repo)) {}

  // Parses one page (a JSON list of entries; "file" entries are kept, folders skipped) and
  // adds its files. Throws Error naming the entry and what was expected when anything in it is
  // not as described above; files already added stay.
  void add_page(std::string_view body);

  const std::vector<HubFile>& files() const { return files_; }
  std::vector<HubFile> take() { return std::move(files_); }

 private:
  void add(HubFile f);

  std::string repo_;
  std::vector<HubFile> files_;
  std::set<std::string> paths_;    // every listed file
  std::set<std::string> folders_;  // every folder a listed file lies in
};

}  // namespace deltafin::cli
