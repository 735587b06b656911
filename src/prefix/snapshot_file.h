// The prefix store's disk tier: one self-contained file per snapshot, so a file is usable on its
// own after a restart (no chain of files to follow) and losing one loses only it.
//
// Layout (every section at a 4 KiB offset, written and read with O_DIRECT through core/file_io
// like the expert store's reads):
//   [0, 4 KiB)   header: JSON text, NUL-padded — magic, version, the checkpoint it belongs to
//                (model id), the prefix length n, the state's shape, the draft state's shape and
//                id, the payload's length and its checksum;
//   [4 KiB, ..)  payload: the n token ids (int32), every KDA layer's S then its conv history,
//                every MLA layer's n latent rows, the draft rows and the draft tail (float32).
// The file is written under a temporary name, synced and renamed, so a crash leaves either the
// old set of files or the new one. A file whose header does not parse, whose model id or shape
// differs, whose size is short or whose checksum fails is never used.
// A snapshot begins with the prompt's token ids, so it is the conversation: files are 0600 and
// the temporary is created exclusively (O_EXCL | O_NOFOLLOW) under a random name
// (`NAME.dfsnap.tmp-` and 16 hex digits); reads open only regular files, never through a link,
// and never block on a FIFO (core/file_io.h).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "generate/speculative.h"
#include "model/config.h"
#include "model/state.h"

namespace deltafin {

// The infix of a snapshot's temporary name: PATH + kSnapshotTempInfix + 16 random hex digits.
inline constexpr const char* kSnapshotTempInfix = ".tmp-";
// Whether a folder entry's name is a snapshot's temporary (an unfinished write to remove).
bool is_snapshot_temp(const std::string& name);

struct SnapshotFile {
  std::string path;
  std::vector<int32_t> ids;  // the prefix the snapshot continues
  uint64_t bytes = 0;        // on disk
  double used = 0;           // last use (the file's modification time), for LRU
  std::string draft_id;      // "" without draft rows
  bool has_draft = false;
};

// Writes the snapshot of `state` (which consumed `ids`) and the draft rows [0, n - lag) with their
// tail, if given, to `path` atomically (mode 0600). Throws IoError naming the file and the
// reason (ENOSPC: "the disk is full"); nothing is left behind on failure.
void write_snapshot_file(const std::string& path, const std::string& model_id,
                         std::span<const int32_t> ids, const State& state, const DraftRows* draft,
                         const std::string& draft_id);

// The header and prefix of a snapshot file, checked against the model (id and state shape) and
// the file's size; nullopt with `*why` set when the file cannot be used (not a regular file
// included: "... is a FIFO (expected a regular file)").
std::optional<SnapshotFile> read_snapshot_header(const std::string& path,
                                                 const std::string& model_id,
                                                 const StateShape& shape, std::string* why);

// Reads the whole file into `state` (replaced: its shape must match) and, when the file holds
// draft rows of `draft_id`, into `*draft`; verifies the checksum first. Throws Error naming the
// file when it is corrupt or unreadable; `state` is then unspecified (the caller resets it).
void read_snapshot_file(const SnapshotFile& f, const std::string& model_id, State& state,
                        const std::string& draft_id, std::optional<DraftRows>* draft);

}  // namespace deltafin
