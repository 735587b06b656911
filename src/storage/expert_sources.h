// The drives the expert store reads from: the model folder (source 0, every expert) and the
// homes given with --home (storage/home.h), each with its own reader queue.
//
// Why it is built this way:
//  * One queue (ReaderPool) per drive, so a slow drive never holds up reads that another could
//    serve, and each drive has its reads in flight at once.
//  * A read goes to the copy that will finish it first: (bytes queued or in flight there + the
//    expert) / the drive's bandwidth — measured while it is busy once it has been busy a second,
//    the probe `place` recorded before that. The store asks in an order that lets every drive
//    finish a layer's reads together (expert_store.cpp, issue_misses_locked).
//  * A home that cannot be used at start (missing, unmounted, another checkpoint, files short)
//    is left out with one warning; a read that fails on a home (read error, checksum) marks it
//    bad for the rest of the run with one warning and is read again from another copy, so
//    nothing fails and no token changes. The model folder is the source of truth: its failures
//    fail the request, as they always did.
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
  ExpertSources(const ExpertDirectory& dir, const Checkpoint& ck, bool direct_io, int readers,
                const std::vector<std::string>& homes);
  ~ExpertSources();  // stop()
  ExpertSources(const ExpertSources&) = delete;
  ExpertSources& operator=(const ExpertSources&) = delete;

  static constexpr int kModel = 0;
  int count() const { return static_cast<int>(drives_.size()); }
  // Homes in use (those that could not be opened are not counted).
  int homes() const { return count() - 1; }
  ShardFiles& model_files() { return files_; }
  const ShardFiles& model_files() const { return files_; }

  // The good drive holding (layer, expert) that would finish reading it first, other than
  // `avoid` (-1: none); -1 when no other drive holds it.
  int choose(int layer, int expert, int avoid = -1) const;
  // How many good drives hold it.
  int copies(int layer, int expert) const;
  // Queues `task` on `source`'s readers, counting `bytes` against its queue until it ran.
  void submit(int source, ReaderPool::Priority p, uint64_t bytes, std::function<void()> task);
  // Reads (layer, expert) from `source` into `buf` (4 KiB aligned, a slot) and returns pointers
  // to its tensors in expert_tensor_suffixes() order. Throws IoError.
  std::vector<const uint8_t*> read(int source, int layer, int expert, uint8_t* buf);
  // Reads it from `source`, and when a home fails, marks that home bad and reads it from the
  // next copy; `*served` is the drive that delivered it. Throws IoError when no copy could.
  std::vector<const uint8_t*> read_with_fallback(int source, int layer, int expert, uint8_t* buf,
                                                 int* served);
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
    uint64_t reads = 0, bytes_read = 0, hedges = 0, hedge_wins = 0, failures = 0;
    double read_time_s = 0;  // summed durations of its reads
    std::string bad_reason;
  };
  double bandwidth_locked(const Drive& d) const;
  void begin_read(Drive& d);
  void end_read(Drive& d, uint64_t bytes, double seconds, bool ok);

  const ExpertDirectory& dir_;
  ShardFiles files_;
  std::vector<std::unique_ptr<Drive>> drives_;
  mutable std::mutex mu_;
};

}  // namespace deltafin
