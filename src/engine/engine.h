// The engine factory: the one place where a checkpoint folder and options become a Model with
// its providers. The CLI (cli/common.cpp), the server and the C API all load through here, so
// the choice of providers (mmap or the budgeted store and streamer), the memory plan and the
// option checks are made once. The model itself sees only the narrow provider interfaces.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/gpu_plan.h"
#include "gpu/options.h"
#include "model/inventory.h"
#include "model/model.h"
#include "storage/checkpoint.h"
#include "storage/expert_store.h"
#include "storage/plan.h"

namespace deltafin {

// A model together with what it was loaded from: the checkpoint, its inventory and the memory
// plan (absent in mmap mode). Everything that computes takes a Model&.
class LoadedModel : public Model {
 public:
  LoadedModel(ModelParts parts, std::shared_ptr<const Checkpoint> ck, InventoryReport inventory,
              std::optional<MemoryPlan> plan);
  const Checkpoint& checkpoint() const { return *checkpoint_; }
  const InventoryReport& inventory() const { return inventory_; }
  const std::optional<MemoryPlan>& plan() const { return plan_; }
  // The GPU backend the model's passes offload to (null: CPU only) and what it holds.
  const std::shared_ptr<gpu::Backend>& gpu() const { return gpu_; }
  const GpuPlan& gpu_plan() const { return gpu_plan_; }
  void set_gpu(std::shared_ptr<gpu::Backend> b, GpuPlan plan) {
    gpu_ = std::move(b);
    gpu_plan_ = std::move(plan);
  }

 private:
  std::shared_ptr<gpu::Backend> gpu_;
  GpuPlan gpu_plan_;
  std::shared_ptr<const Checkpoint> checkpoint_;
  InventoryReport inventory_;
  std::optional<MemoryPlan> plan_;
};

// What the user asked of the engine — the CLI's flags, the C API's parameters (and Python's
// through them) — typed where a front end reads it: sizes in bytes, choices as enums, "the
// default" as an empty optional. What the runtime adds (sequences, rows per pass, a drafter's and
// the state cache's memory) is a PlanShape beside it (storage/plan.h).
struct EngineOptions {
  std::string model;
  int threads = 0;
  // false (the CLI): `threads` sizes the process-wide pool; true (the C API): the model owns a
  // pool of that many threads, so models loaded side by side neither share nor resize threads.
  bool own_threads = false;
  std::string kernels;                    // force a kernel table
  std::optional<uint64_t> memory_budget;  // unset: the default share of RAM
  int64_t ctx = 0;                        // positions per sequence (0: plan_context's default)
  // Plain mmap paging of the shards (no budget, no store): the page cache does all I/O.
  bool mmap = false;
  TrunkFormat trunk = TrunkFormat::kBF16;  // kInt8 is lossy (--trunk int8)
  CachePolicy cache_policy = CachePolicy::kLRU;
  int readers = 4;
  // Streamed trunk units read ahead (--trunk-read-ahead; storage/plan.h): 0 = as the budget
  // allows beside the expert cache.
  int trunk_read_ahead = 0;
  bool prefetch = true;   // predict the next layer's experts and read them ahead
  bool direct_io = true;  // O_DIRECT where the file system allows it
  // Homes on other drives with copies of experts (--home; storage/home.h). Needs the store.
  std::vector<std::string> homes;
  // Smallest piece of an expert read split over several drives (storage/expert_sources.h).
  uint64_t read_piece = ExpertSources::kDefaultMinPiece;
  // Expert heat counts: unset = the model folder's file in the cache folder, "" = none.
  std::optional<std::string> heat_file;
  gpu::Options gpu;      // the Vulkan backend (--gpu, --gpu-memory, --gpu-min-rows): off
  bool verbose = false;  // print the memory plan and the kernels even when stderr is not a terminal
  bool plan_on_terminal = true;  // also print them when stderr is a terminal (the CLI)
};

// A stand-in for the routed-expert provider (tests): replaces the expert store.
using ExpertFactory = std::function<std::unique_ptr<ExpertProvider>(
    const ModelConfig&, const Checkpoint&, ExpertFormat)>;

// Opens the checkpoint folder `o.model` as `o` says, planning memory for `shape`: config, shards,
// inventory check, plan, providers. Nothing process-wide changes (load_model applies threads and
// kernels). Throws Error.
std::unique_ptr<LoadedModel> open_model(const EngineOptions& o, const PlanShape& shape = {},
                                        const ExpertFactory& experts = {});
// A folder with every setting at its default and no heat file (tests, tools).
std::unique_ptr<LoadedModel> open_model(const std::string& dir);

// Read bandwidth of each drive experts come from, with O_DIRECT and `readers` threads, `bytes`
// per drive (best of `tries`): [0] the model folder's shards, then each home the model reads
// (its data files). The disk rooflines of bench, the server's engine view and /metrics use the
// sum.
std::vector<double> probe_drives(LoadedModel& m, int readers, uint64_t bytes, int tries = 1);

// The front ends' load: applies threads and kernels, checks the folder exists, and opens it
// (errors say what is missing or wrong, naming the option).
std::unique_ptr<LoadedModel> load_model(const EngineOptions& o, const PlanShape& shape = {});
// Applies --threads / --kernels (load_model does it too).
void apply_engine_options(const EngineOptions& o);
// Throws InvalidArgument unless `dir` exists and is a folder.
void require_model_folder(const std::string& dir);

// "2G", "512M", "1.5" (GiB), ... -> bytes. Throws SettingError for the setting `what` (plain
// words: "memory budget").
uint64_t parse_size(const std::string& text, const std::string& what);
// Where the demo and the heat statistics live: $DELTAFIN_CACHE, else $XDG_CACHE_HOME/deltafin,
// else ~/.cache/deltafin.
std::string cache_dir();
// Where the expert heat statistics of a model folder persist (in the cache folder).
std::string heat_file_for(const std::string& model_dir);

}  // namespace deltafin
