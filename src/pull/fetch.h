// The download engine of `deltafin pull`: files cut into chunks, fetched by several connections
// at once with HTTP ranges, written in place into a preallocated `.part` file, each finished
// chunk recorded (after its bytes are flushed) in a `.done` map beside it — so a run stopped
// anywhere (SIGKILL, a dropped network, a full disk) resumes from the chunks it had. A finished
// file is hashed (SHA-256 for LFS files, the git blob SHA-1 otherwise) against the listing; a
// mismatch discards it and fetches it again, a match renames it into place (atomic publish).
//
// Partial files live in DIR/.deltafin-pull/partial, named KEY.part and KEY.done where KEY is a
// SHA-256 this program computes over the file's listed path, hashes and size (partial_key): so
// no string of the hub ever becomes a file name, two paths with the same bytes never share a
// partial file, and a resumed run finds the partial file of the same file at any revision. That
// folder is reached only through descriptors opened with O_NOFOLLOW below DIR (PullState), and
// partial files are created with O_EXCL, mode 0600 (folders 0700), and reused only when they are
// regular files of ours with one link. A file's two descriptors are open only while its chunks
// are in flight, so a run holds about two per connection however many files it fetches. After a
// successful pull the partial files of files no longer listed are removed: only names of the
// form KEY.done that are regular files of ours starting with the map's header, and their
// KEY.part when that is a regular file of ours; nothing else in the folder is touched.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pull/hub.h"

namespace deltafin::pull {

// DIR/.deltafin-pull, pull's own state (manifest.json and partial/), held open. Nothing below
// DIR is reached through a symbolic link: a link (or anything but a folder) at .deltafin-pull or
// .deltafin-pull/partial is refused with a message, not followed.
class PullState {
 public:
  // Opens DIR (which must exist) and DIR/.deltafin-pull, creating the latter (0700).
  explicit PullState(const std::string& dir);
  ~PullState();
  PullState(const PullState&) = delete;
  PullState& operator=(const PullState&) = delete;

  const std::string& dir() const { return dir_; }
  int dir_fd() const { return dir_fd_; }
  std::string partial_path() const;
  // The partial folder's descriptor, created (0700) when `create`; -1 when it is absent and not
  // `create`d.
  int partial_fd(bool create);

  // manifest.json's text; "" when there is none (or it is not a regular file of at most 1 GiB).
  std::string read_manifest() const;
  // Replaces manifest.json atomically (a 0600 temporary file created with O_EXCL, renamed).
  void write_manifest(const std::string& text) const;
  // Disk space already held by partial files of `files` (allocated blocks: a run reserves each
  // file's whole size when it opens it, so this is not what was fetched).
  uint64_t partial_bytes(const std::vector<HubFile>& files);
  // Bytes of `files` an earlier run fetched and recorded in the maps, for chunks of
  // `chunk_bytes` (what a resumed run with that --chunk-size need not fetch again).
  uint64_t fetched_bytes(const std::vector<HubFile>& files, uint64_t chunk_bytes);
  // Removes the partial files pull made for files other than `keep` (the whole listing of the
  // revision just pulled: those of another --include stay) and the partial folder once empty.
  // Returns how many files were removed.
  int remove_stale_partials(const std::vector<HubFile>& keep);

 private:
  std::string dir_;
  int dir_fd_ = -1, state_fd_ = -1, partial_fd_ = -1;
};

// The stem of a file's partial files: hex SHA-256 of its path, oid, sha256 and size.
std::string partial_key(const HubFile& f);

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

// Fetches `files` of `repo` into the state's DIR (each to DIR/path; folders it creates are 0700,
// files 0600). Throws Error with one line on a failure that retrying cannot fix (a refused
// request, a full disk, a file whose hash never matches); what was fetched stays for the next
// run.
FetchResult fetch_files(const HubRepo& repo, const std::vector<HubFile>& files, PullState& state,
                        const std::string& token, const FetchOptions& o);

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

}  // namespace deltafin::pull
