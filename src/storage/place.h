// `deltafin place`: fills homes (storage/home.h) with copies of the model folder's experts, as
// the placement (storage/placement.h) decides from each drive's probed bandwidth, the persisted
// expert heat and the room each home may use; and `place --verify`, which re-checks homes.
//
// Why it is built this way:
//  * Resumable. The decision is written to every home first (.deltafin-place.json), so a rerun
//    of the same request continues it instead of probing and deciding again; copies go to
//    data-ID.partial/ and a journal line per expert is appended only after its bytes are synced,
//    so an interrupted place (SIGINT, SIGKILL, power) redoes at most the unsynced tail.
//  * Checked. Each copy's XXH3 checksum is taken from the bytes read from the model folder; when
//    a home is complete, every copy is read back from the drive and checked before it is used.
//  * Atomic. The finished data folder is renamed into place and the manifest written with a
//    rename; the old placement's files are deleted only after that, so a home is never half old,
//    half new.
//  * Deletes only what it made. A home may hold other files: place removes folders by the names
//    it recorded (the record names the folder a copy goes to, the manifest its data folder and
//    the ones it superseded), never by a pattern. What it writes is private (folders 0700, files
//    0600, never through a link), and its probe file (a random name, created exclusively) is
//    removed however the probe ends.
//  * Refuses early. The room every home needs is checked against its free space before
//    anything is written anywhere.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace deltafin {

inline constexpr double kSpareRoom = -1;
inline constexpr double kSpareShareOfFree = 0.5;

struct PlaceOptions {
  std::string model;               // the model folder (the source of truth)
  std::vector<std::string> homes;  // folders on other drives (created if their parent exists)
  uint64_t budget_per_home = 0;    // most bytes of copies on each home (0: no cap)
  // Share of the experts, hottest first, copied to every home; kSpareRoom (the default): each
  // home gets its share of the reads, then its spare room (up to kSpareShareOfFree of its drive's
  // free space, within budget_per_home) takes the hottest experts again (placement.h, step 3).
  double replicate = kSpareRoom;
  uint64_t probe_bytes = 256ull << 20;  // bytes read per drive by the bandwidth probe
  int threads = 4;                      // reads in flight per drive (probe and copy)
  std::string heat_file;                // persisted expert heat ("" or missing: all equal)
  bool direct_io = true;
  // Polled between experts: true stops the copy after syncing what is done (SIGINT).
  std::function<bool()> interrupted;
  // Progress lines (probes, the decision, per-home progress); none when empty.
  std::function<void(const std::string&)> progress;
};

struct PlacedHome {
  std::string dir;
  double probe_bytes_per_s = 0;
  double share = 0;  // expected share of a pass's expert bytes served by this home
  size_t experts = 0;
  uint64_t bytes = 0;          // on the drive (4 KiB grid)
  uint64_t bytes_written = 0;  // by this run (0: it was up to date, or resumed at the end)
  bool up_to_date = false;     // nothing to do: already this placement
};

struct PlaceResult {
  double model_probe_bytes_per_s = 0;
  double model_share = 0;
  size_t replicated = 0;
  size_t spare_copies = 0;  // copies in the homes' spare room (the default)
  uint64_t spare_bytes = 0;
  std::vector<PlacedHome> homes;
};

// Throws InvalidArgument (a bad request, a home without room: before writing anything), IoError,
// or Error("place interrupted ...") when `interrupted` said so.
PlaceResult place_experts(const PlaceOptions& o);

struct HomeCheck {
  std::string dir;
  size_t experts = 0;
  uint64_t bytes = 0;
  std::vector<std::string> problems;  // empty: every copy checks and equals the model's bytes
};

// Re-reads every copy in each home, checks it against its manifest checksum and against the
// model folder's bytes.
std::vector<HomeCheck> verify_homes(const std::string& model, const std::vector<std::string>& homes,
                                    bool direct_io = true);

}  // namespace deltafin
