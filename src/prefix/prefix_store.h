// The prefix store: snapshots of sequence states, keyed by the token prefix they consumed, so a
// request whose prompt starts with a kept prefix feeds only the tokens after it (docs/
// ARCHITECTURE.md, "Prefix snapshots"; the policy of where snapshots are taken is in
// prefix/reuse.h).
//
// K3's state is not truncatable: the KDA recurrent states and short-conv histories only move
// forward, while the MLA latent cache (and a draft model's cache) is one row per position. So
// the store is a radix tree over token ids whose nodes hold
//   - the MLA cache rows (and draft cache rows) of their span of positions, shared by every
//     node below them, not copied;
//   - optionally a snapshot at their end position: every KDA layer's S and conv history, and the
//     drafter's tail — exactly what is needed, with the rows above it, to continue from there.
// restore() returns the deepest snapshot on the prompt's path; the result is the state the
// original sequence had at that position, bit for bit.
//
// Tiers: the tree lives in RAM inside `ram_bytes` (a share of the memory budget the plan shows);
// every snapshot is also written through to its own file in `dir` (snapshot_file.h), bounded by
// `disk_bytes`, so snapshots survive a restart and the RAM tier can drop them. Eviction is least
// recently used among leaves, so a prefix many conversations share (a long system prompt) stays
// longest: it stops being a leaf while any conversation below it is kept. A file that is partial,
// corrupt or from another checkpoint is ignored with one warning line and removed; a write that
// fails (a full disk, an unwritable folder) says so in one line and the snapshot stays in RAM.
// Nothing here changes what a sequence computes: a miss only costs prefill.
//
// The folder (made 0700 when it is made here; files 0600, snapshot_file.h) belongs to one
// process at a time: an advisory lock (flock on `.deltafin-lock`, which names the holder's pid)
// is taken when the store opens it and held until the store is destroyed. A second process
// given the same folder keeps its snapshots in RAM only, with one warning line naming the
// holder: two writers would each keep `disk_bytes` of files (twice the cap) and each remove
// the other's temporaries. In the folder only regular files are read or removed: a FIFO, a link
// or a folder named like a snapshot is skipped with one warning line and left as it is.
//
// Thread-safe (one mutex): the engine thread restores and saves, /metrics reads stats().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "generate/speculative.h"
#include "model/config.h"
#include "model/state.h"
#include "prefix/snapshot_file.h"

namespace deltafin {

// The lock file in a state-cache folder: one process at a time uses the folder.
inline constexpr const char* kStateCacheLock = ".deltafin-lock";

struct PrefixStoreOptions {
  uint64_t ram_bytes = 0;  // RAM for the tree (0: disk only)
  std::string dir;         // the disk tier ("": none)
  uint64_t disk_bytes = 0;
  std::string model_id;  // the checkpoint the snapshots belong to (config and tensor headers)
};

struct PrefixStats {
  int64_t ram_snapshots = 0, disk_snapshots = 0;
  uint64_t ram_bytes = 0, disk_bytes = 0;
  int64_t lookups = 0, ram_hits = 0, disk_hits = 0;
  int64_t tokens_reused = 0;  // prompt tokens not prefilled thanks to a restore
  int64_t saves = 0, disk_writes = 0, disk_errors = 0;
};

struct Restored {
  int64_t position = 0;  // tokens the restored state consumed (0: nothing found)
  bool from_disk = false;
  double seconds = 0;       // the restore (a disk read included)
  bool with_draft = false;  // the drafter continues too
};

class PrefixStore {
 public:
  PrefixStore(const ModelConfig& config, PrefixStoreOptions options);
  ~PrefixStore();
  PrefixStore(const PrefixStore&) = delete;
  PrefixStore& operator=(const PrefixStore&) = delete;

  // The deepest snapshot of a prefix ids[0, n) with n <= limit, from RAM or disk: `state` is
  // replaced by it and `drafter` (when given) continues from its draft rows. Nothing found:
  // position 0 and `state` untouched.
  Restored restore(std::span<const int32_t> ids, int64_t limit, State& state, Drafter* drafter);
  // Keeps `state`, which consumed exactly `ids`, as a snapshot (and the drafter's rows).
  void save(std::span<const int32_t> ids, const State& state, Drafter* drafter);
  // A snapshot of exactly this prefix is kept (in RAM or on disk).
  bool has(std::span<const int32_t> ids) const;

  PrefixStats stats() const;
  const PrefixStoreOptions& options() const { return o_; }
  // One line for -v and the start-up banner: where snapshots live and how much they may take.
  std::string describe() const;

 private:
  struct Snap;
  struct Node;
  Node* insert_locked(std::span<const int32_t> ids, const State& state, const DraftRows* rows,
                      const std::string& draft_id);
  void evict_locked();
  void drop_node_locked(Node* n);
  uint64_t node_bytes(const Node& n) const;
  void index_disk();
  bool lock_folder();
  void write_through_locked(std::span<const int32_t> ids, const State& state, const DraftRows* rows,
                            const std::string& draft_id);
  void disk_warning_locked(const std::string& line);
  std::string file_for(std::span<const int32_t> ids) const;

  ModelConfig config_;
  StateShape shape_;
  PrefixStoreOptions o_;
  mutable std::mutex m_;
  std::unique_ptr<Node> root_;
  uint64_t ram_used_ = 0, clock_ = 0;
  int64_t ram_snaps_ = 0;
  // The draft rows the tree holds: all of one drafter (its state id), of one width and lag.
  std::string draft_id_;
  int64_t draft_width_ = 0, draft_lag_ = 0;
  bool disk_ = false;
  int lock_fd_ = -1;  // the folder's lock, held while this store uses it
  std::vector<SnapshotFile> files_;
  uint64_t disk_used_ = 0;
  std::set<std::string> warned_;
  PrefixStats stats_;
};

// The id of a checkpoint for the store: a hash of its config.json and every tensor's name,
// dtype, shape and place (what a snapshot's numbers depend on).
std::string checkpoint_id(const std::string& config_text,
                          const std::vector<std::string>& tensor_lines);

}  // namespace deltafin
