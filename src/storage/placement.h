// Which experts go to which home: the decision `deltafin place` writes out. A pure
// function of the drives' bandwidths, the homes' room and the experts' heat, so it is tested on
// its own and a rerun with the same inputs decides the same thing.
//
// The model folder is a drive too: it holds every expert and keeps serving them. A pass reads
// each expert it misses from one copy, so the expected bytes a drive serves are the heat-weighted
// bytes of the experts read there; the placement aims to split them in proportion to bandwidth,
// which is when all drives finish a pass's reads together:
//  1. the hottest `replicate` share of experts is copied to every home (room permitting); at run
//     time the reader splits each of their reads over the copies so that they finish together,
//     which evens out the passes whose choice of experts happens to favour one drive (with split
//     reads the hottest half on every home is about as fast as full copies:
//     docs/PERFORMANCE-DRIVES.md);
//  2. every other expert, hottest first, goes to the drive that would finish its expected load
//     earliest: the model folder (no copy), or a home below its share with room. So hot experts
//     spread over all drives (each gets a like mix of experts the cache tends to keep and experts
//     it must read: placing the hottest on the homes alone would leave them fewer reads than their
//     share), and a fast home too small for its share holds the hottest experts it can;
//  3. a home's spare room (`spare`: bytes beyond its share, `place`'s default fills up to half
//     of its drive's free space) takes the hottest experts it does not hold yet, so they are read
//     from one more drive: with room for everything, every home is a full copy, the fastest
//     placement measured (docs/PERFORMANCE-DRIVES.md). The shares are then forecast as the
//     reader splits an expert held by several drives: by their bandwidths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace deltafin {

struct PlacementRequest {
  double model_bandwidth = 0;           // bytes/s of the model folder's drive
  std::vector<double> home_bandwidth;   // bytes/s per home
  std::vector<uint64_t> home_capacity;  // bytes each home may hold (max = no limit)
  std::vector<double> heat;             // per expert: how often passes asked for it
  std::vector<uint64_t> bytes;          // per expert: bytes a copy takes on a home
  double replicate = 0;                 // share of experts (hottest first) on every home
  std::vector<uint64_t> spare;          // per home: bytes of copies beyond its share (step 3;
                                        // empty = none)
};

struct Placement {
  std::vector<std::vector<size_t>> homes;  // per home: the experts it holds (ascending)
  // Expected share of a pass's bytes per drive, the model folder first (sums to 1).
  std::vector<double> share;
  size_t replicated = 0;     // experts copied to more than one home
  size_t spare_copies = 0;   // copies step 3 made (all homes)
  uint64_t spare_bytes = 0;  // and their bytes
};

inline constexpr uint64_t kNoCapacityLimit = std::numeric_limits<uint64_t>::max();

// Throws InvalidArgument on inconsistent sizes or a non-positive bandwidth.
Placement plan_placement(const PlacementRequest& r);

}  // namespace deltafin
