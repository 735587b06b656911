// Homes: folders on other drives that hold copies of routed experts, so a pass reads its experts
// from several drives at once (issue 28; `deltafin place` fills them, storage/place.h).
//
// Why it is laid out this way:
//  * The model folder stays the source of truth. A home holds a manifest (deltafin-home.json:
//    the checkpoint it belongs to, which experts, where, their XXH3 checksums) and one data file
//    per MoE layer (data-ID/layer-LLL.bin) with every expert's image (ExpertLocation::image: its
//    bytes as the model folder's aligned reads put them in a slot) at a 4 KiB-aligned offset: one
//    aligned O_DIRECT read per expert, and any aligned piece of it lands in a slot where the
//    model folder's read of that piece would, so one expert can be read from several drives.
//  * A home belongs to one checkpoint: its fingerprint covers config.json, every shard's name,
//    size and safetensors header, and three 64 KiB samples of each shard's bytes (so a model
//    regenerated with the same layout but other weights is not mistaken for the old one). A home
//    of another checkpoint is not used.
//  * Every read from a home is checked against the manifest's checksum: a copy on another drive
//    can be stale, damaged or on a failing disk, and K3 must still decide every token. A failed
//    check makes the read fall back to another copy (storage/expert_sources.h).
//  * The data folder is named by the placement's ID, and the manifest is the commit point: a new
//    placement is written beside the old one and published by renaming the manifest, so a home
//    is always either the old placement or the new one.
//  * A home may hold the user's own files, and `place` deletes only folders it made, by the exact
//    names it recorded: the manifest names its data folder and the earlier placements' folders it
//    replaced (`superseded`, removed once it is published; kept in the manifest so a run stopped
//    before removing them finishes the job next time), the place record (.deltafin-place.json)
//    the folder a copy in progress goes to. A `data-backup/` of the user's is never touched.
//  * Private: folders place makes are 0700 and its files 0600, created without following links.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "storage/shard_files.h"

namespace deltafin {

class Checkpoint;
class ExpertDirectory;
struct ExpertLocation;

inline constexpr const char* kHomeManifestName = "deltafin-home.json";
// Format 1 stored an expert's tensors back to back (not its image): such a home is not used and
// `place` rewrites it.
inline constexpr const char* kHomeFormat = "deltafin-home/2";

struct HomeEntry {
  int layer = 0, expert = 0;
  uint64_t offset = 0;    // in the layer's data file, on the 4 KiB grid
  uint64_t bytes = 0;     // the expert's bytes (its tensors' sizes summed)
  uint64_t checksum = 0;  // expert_checksum() of them
};

struct HomeManifest {
  std::string checkpoint;  // checkpoint_fingerprint() of the model folder it was placed from
  std::string placement;   // the placement's ID (names the data folder)
  std::string args;        // what `place` was asked (homes, budgets, replication): a rerun with
                           // the same request finds the home up to date
  std::string model;       // the model folder at place time (for messages)
  double probe_bytes_per_s = 0;        // this home's read bandwidth when placed
  double model_probe_bytes_per_s = 0;  // the model folder's
  std::vector<HomeEntry> experts;
  // Folders of earlier placements `place` made here and removes after publishing this one (names
  // checked by is_place_folder_name).
  std::vector<std::string> superseded;

  std::string data_dir() const { return "data-" + placement; }
  std::string to_json() const;
  // Throws InvalidArgument naming `what` and the field at fault.
  static HomeManifest parse(const std::string& text, const std::string& what);
};

// Whether `name` is a name `place` gives a folder in a home: "data-" and a placement ID (hex
// digits), with or without ".partial". Names read back from a record must pass it before
// anything is removed.
bool is_place_folder_name(const std::string& name);
// The folders `place` made in `home` by its manifest, of any format: the published placement's
// data folder and the ones it superseded. Empty without a readable manifest.
std::vector<std::string> home_folders_made(const std::string& home);

// "layer-007.bin": the data file of one MoE layer inside a home's data folder.
std::string home_layer_file(int layer);
// The checksum a home records of an expert, from its image: XXH3-64 of its tensors' bytes when
// they lie back to back, else XXH3-64 of the tensors' own XXH3-64s in order.
uint64_t expert_checksum(const ExpertLocation& loc, const uint8_t* image);
// Whether two images hold the same tensor bytes within [begin, end) of the image (their padding
// may differ).
bool same_expert_bytes(const ExpertLocation& loc, const uint8_t* a, const uint8_t* b,
                       uint64_t begin = 0, uint64_t end = UINT64_MAX);

// The fingerprint a home records of its checkpoint (16 hex digits). Reads a few KiB per shard.
std::string checkpoint_fingerprint(const Checkpoint& ck);

// The data files of a home's current placement (for bandwidth probes); empty when it has none.
std::vector<std::string> home_data_files(const std::string& home);

// Reads HOME/deltafin-home.json. Throws IoError ("no ... (run deltafin place)") or
// InvalidArgument (malformed).
HomeManifest read_home_manifest(const std::string& home);

// A home opened for reading: its manifest checked against the checkpoint and the expert
// directory, its data files open (O_DIRECT where the file system takes it).
class ExpertHome {
 public:
  // Throws Error with one line saying why the home cannot be used (missing, another checkpoint,
  // a data file missing or shorter than the manifest says, an entry that does not fit the model).
  ExpertHome(std::string dir, const std::string& fingerprint, const ExpertDirectory& experts,
             bool direct_io);
  ~ExpertHome();

  const std::string& dir() const { return dir_; }
  const HomeManifest& manifest() const { return manifest_; }
  // The copy of (layer, expert) here, or null.
  const HomeEntry* find(int layer, int expert) const;
  // Reads [begin, end) of an entry's image (4 KiB-aligned bounds) to `image + begin`; `image` is
  // 4 KiB aligned. Throws IoError naming the home, the file and what failed.
  void read_piece(const HomeEntry& e, uint64_t begin, uint64_t end, uint8_t* image,
                  const std::string& what) const;
  // Checks an entry's image against its checksum. Throws IoError naming the file when it fails
  // ("checksum of ... (the copy is damaged)").
  void check(const HomeEntry& e, const uint8_t* image, const std::string& what) const;
  // Reads an entry's whole image and checks it.
  void read(const HomeEntry& e, uint8_t* image, const std::string& what) const;
  // The data file an entry lies in (for messages).
  const std::string& file_of(const HomeEntry& e) const;
  bool direct() const;

 private:
  std::string dir_;
  HomeManifest manifest_;
  const ExpertDirectory& experts_;
  int first_moe_ = 0, num_experts_ = 0;
  std::vector<int> index_;                          // [(layer - first) * E + expert] -> entry or -1
  std::vector<std::unique_ptr<DirectFile>> files_;  // [layer - first] (null: none here)
};

}  // namespace deltafin
