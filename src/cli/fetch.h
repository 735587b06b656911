// The download engine of `deltafin pull`: files cut into chunks, fetched by several connections
// at once with HTTP ranges, written in place into a preallocated `.part` file, each finished
// chunk recorded (after its bytes are flushed) in a `.done` map beside it — so a run stopped
// anywhere (SIGKILL, a dropped network, a full disk) resumes from the chunks it had. A finished
// file is hashed (SHA-256 for LFS files, the git blob SHA-1 otherwise) against the listing; a
// mismatch discards it and fetches it again, a match renames it into place (atomic publish).
// Partial files live in DIR/.deltafin-pull/partial, named by the file's hash.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/hub.h"

namespace deltafin::cli {

struct FetchOptions {
  int connections = 8;
  uint64_t chunk_bytes = 64ull << 20;
  int max_tries = 10;  // consecutive failed attempts of one chunk before giving up
};

struct FetchResult {
  uint64_t bytes_fetched = 0;  // bytes received this run
  int files_published = 0;
  int refetched = 0;  // files fetched again after a hash mismatch
  double seconds = 0;
};

// Where the partial files of a pull into `dir` live.
std::string partial_dir(const std::string& dir);
// Bytes already held by partial files of `files` (what a resumed run need not fetch again).
uint64_t partial_bytes(const std::string& dir, const std::vector<HubFile>& files);

// Fetches `files` of `repo` into `dir` (each to dir/path). Throws Error with one line on a failure
// that retrying cannot fix (a refused request, a full disk, a file whose hash never matches); what
// was fetched stays for the next run.
FetchResult fetch_files(const HubRepo& repo, const std::vector<HubFile>& files,
                        const std::string& dir, const std::string& token, const FetchOptions& o);

// A file's hash as the hub lists it, fed in order: SHA-256 of the bytes (LFS files), or the git
// blob id (SHA-1 of "blob SIZE\0" + the bytes).
class FileHasher {
 public:
  FileHasher(bool git_blob, uint64_t size);
  ~FileHasher();
  FileHasher(const FileHasher&) = delete;
  FileHasher& operator=(const FileHasher&) = delete;
  void update(const void* data, size_t n);
  std::string hex();  // once, at the end

 private:
  void* ctx_;
};

// Hex SHA-256 of a file's bytes, and its git blob id.
std::string file_sha256(const std::string& path);
std::string file_git_oid(const std::string& path);

}  // namespace deltafin::cli
