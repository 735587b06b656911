// The drives the expert store reads from: the model folder (source 0, every expert) and the
// homes given with --home (storage/home.h), each with its own reader queue.
//
// Why it is built this way:
//  * One queue (ReaderPool) per drive, so a slow drive never holds up reads that another could
//    serve, and each drive has its reads in flight at once.
//  * A read goes where it will finish first: each drive's (bytes queued or in flight there) /
//    its bandwidth — measured while it is busy once it has been busy a second, the probe `place`
//    recorded before that. An expert several drives hold is split into pieces of its image
//    (ExpertLocation::image, the same layout on every drive) so that those drives finish it
//    together: a layer's misses then keep every drive that holds them busy to the end, where
//    whole-expert reads leave the layer paced by whichever drive got one expert more (11 reads
//    over 3 drives: 4 at the busiest, 2.75x at best; split, 3x). Pieces are at least
//    `min_piece` bytes (1 MiB by default: smaller requests cost more per byte on real drives).
//    The store asks in an order that lets every drive finish a layer's reads together
//    (expert_store.cpp, issue_misses_locked).
//  * A home that cannot be used at start (missing, unmounted, another checkpoint, files short)
//    is left out with one warning; a read that fails on a home marks it bad for the rest of the
//    run with one warning and is read again from another copy, so nothing fails and no token
//    changes. Every expert with bytes from a home is checked against the manifest's checksum
//    once all its pieces landed; when that fails, the pieces homes delivered are read again from
//    the model folder and the home whose bytes differed is the one marked bad. The model folder
//    is the source of truth: its failures fail the request.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/experts.h"
#include "storage/expert_directory.h"
#include "storage/home.h"
#include "storage/reader_pool.h"
#include "storage/shard_files.h"

namespace deltafin {

class ExpertSources {
 public:
  // `model_gate`: shared with the trunk streamer's pool, which reads the same drive (the model
  // folder), so its read-ahead yields to this drive's demand reads (reader_pool.h).
  ExpertSources(const ExpertDirectory& dir, const Checkpoint& ck, bool direct_io, int readers,
                const std::vector<std::string>& homes, uint64_t min_piece = kDefaultMinPiece,
                std::shared_ptr<ReadGate> model_gate = nullptr);
  ~ExpertSources();  // stop()
  ExpertSources(const ExpertSources&) = delete;
  ExpertSources& operator=(const ExpertSources&) = delete;

  static constexpr int kModel = 0;
  static constexpr uint64_t kDefaultMinPiece = 1ull << 20;
  int count() const { return static_cast<int>(drives_.size()); }
  // Homes in use (those that could not be opened are not counted).
  int homes() const { return count() - 1; }
  ShardFiles& model_files() { return files_; }
  const ShardFiles& model_files() const { return files_; }

  // A stretch [begin, end) of an expert's image, read from one drive.
  struct Piece {
    int source = kModel;
    uint64_t begin = 0, end = 0;
  };
  // How to read (layer, expert) now: from the good drive that would finish it first, or split
  // over the good drives holding it so that they finish it together; never from `avoid` (-1:
  // none). Empty when no drive but `avoid` holds it. Pieces cover the image in order.
  std::vector<Piece> plan(int layer, int expert, int avoid = -1) const;
  // How many good drives hold it.
  int copies(int layer, int expert) const;
  // Queues `task` on `source`'s readers, counting `bytes` against its queue until it ran.
  void submit(int source, ReaderPool::Priority p, uint64_t bytes, std::function<void()> task);
  // Reads a piece into `image` (4 KiB aligned, a slot). When a home fails, marks it bad and
  // reads the piece from the next copy; `*served` is the drive that delivered it. Throws IoError
  // when no copy could (the model folder failed).
  void read_piece(const Piece& p, int layer, int expert, uint8_t* image, int* served);
  // Once every piece landed (`served`: where each came from): checks bytes that came from homes
  // against the checksum, repairing them from the model folder and marking the damaged home bad
  // when it fails, and returns pointers to the tensors. Throws IoError when the model folder
  // fails the repair.
  std::vector<const uint8_t*> finish(int layer, int expert, uint8_t* image,
                                     const std::vector<Piece>& served);
  // All of (layer, expert) from `source` alone, checked (hedged reads): throws IoError on any
  // failure, with no fallback.
  std::vector<const uint8_t*> read_whole(int source, int layer, int expert, uint8_t* image);
  // Counted on the drive that ran a hedged read (and whether it won).
  void count_hedge(int source, bool won);
  void mark_bad(int source, const std::string& why);
  bool bad(int source) const { return drives_[static_cast<size_t>(source)]->bad.load(); }
  // Typical seconds one read of `bytes` takes on `source` once it starts.
  double read_seconds(int source, uint64_t bytes) const;
  // Bytes per second the good drives read together (measured while busy, else their probes).
  double bandwidth() const;

  std::vector<SourceStats> stats() const;
  double busy_seconds() const;  // summed over the drives' reader threads
  // "model folder + 2 homes (/a 40%, /b 30%)" style summary for the store's describe().
  std::string describe() const;
  bool direct() const;
  void stop();

 private:
  struct Drive {
    std::string name;
    std::unique_ptr<ExpertHome> home;  // null for the model folder
    double probe = 0;
    uint64_t experts = 0;
    std::unique_ptr<ReaderPool> pool;
    std::atomic<bool> bad{false};
    // Under mu_:
    uint64_t queued = 0;  // bytes submitted and not finished
    int in_flight = 0;
    double busy_since = 0, busy_s = 0;
    uint64_t reads = 0, bytes_read = 0, hedges = 0, hedge_wins = 0, failures = 0, pieces = 0;
    double read_time_s = 0;  // summed durations of its reads
    std::string bad_reason;
  };
  double bandwidth_locked(const Drive& d) const;
  // Reads a piece from `source` only (throws IoError).
  void read_from(int source, const Piece& p, int layer, int expert, uint8_t* image);
  void begin_read(Drive& d);
  // `piece`: the read was part of an expert split over several drives.
  void end_read(Drive& d, uint64_t bytes, double seconds, bool ok, bool piece);

  const ExpertDirectory& dir_;
  uint64_t min_piece_;
  ShardFiles files_;
  std::vector<std::unique_ptr<Drive>> drives_;
  mutable std::mutex mu_;
};

}  // namespace deltafin
