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

struct LoadOptions {
  // Plain mmap paging of the shards (no budget, no store): the page cache does all I/O.
  bool mmap = false;
  PlanOptions plan;  // memory budget and what it must hold
  CachePolicy cache_policy = CachePolicy::kLRU;
  int readers = 4;
  bool direct_io = true;
  bool prefetch = true;   // predict the next layer's experts and read them ahead
  std::string heat_file;  // persisted expert use counts ("" = none)
  // Homes on other drives with copies of experts (--home; storage/home.h). Needs the store.
  std::vector<std::string> homes;
  // Smallest piece of an expert read split over several drives (storage/expert_sources.h).
  uint64_t read_piece = ExpertSources::kDefaultMinPiece;
  bool print_plan = false;  // write the plan to stderr
  // The Vulkan backend (--gpu, --gpu-memory): off by default. Its selection line is always
  // written to stderr when it is not off, its plan with the memory plan.
  gpu::Options gpu;
  // -1: passes run on the process-wide pool (the CLI sets it with --threads); >= 0: the model
  // owns a pool of that many threads (0 = one per physical core), so models loaded side by side
  // in one process (the C API) neither share nor resize each other's threads.
  int threads = -1;
  // Replaces the default expert provider (tests).
  std::function<std::unique_ptr<ExpertProvider>(const ModelConfig&, const Checkpoint&,
                                                ExpertFormat)>
      make_experts;
};

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

// Opens a checkpoint folder: config, shards, inventory check, plan, providers. Throws Error.
std::unique_ptr<LoadedModel> load_model(const std::string& dir, const LoadOptions& options = {});

// The engine options every front end offers (the CLI's flags, the server, the C API).
struct EngineOptions {
  std::string model;
  int threads = 0;
  // false (the CLI): `threads` sizes the process-wide pool; true (the C API): the model owns a
  // pool of that many threads, so models loaded side by side neither share nor resize threads.
  bool own_threads = false;
  std::string kernels;               // force a kernel table
  std::string memory_budget;         // SIZE, "" = default share of RAM
  uint64_t memory_budget_bytes = 0;  // the same in bytes (the C API); used when the text is ""
  bool mmap = false;
  std::string cache_policy = "lru";
  int readers = 4;
  bool no_prefetch = false;
  bool no_direct_io = false;
  std::vector<std::string> homes;  // --home DIR (repeatable)
  std::string read_piece;          // --read-piece SIZE ("" = 1 MiB)
  std::string trunk = "bf16";
  int64_t ctx = 0;           // positions per sequence to plan for (0 = min(model, 8192))
  int sequences = 1;         // states to plan for (the server sets this)
  int64_t max_rows = 256;    // rows per pass to plan for (0 = auto: from the budget)
  int64_t prefill_rows = 0;  // with auto: the rows a prompt needs (0 = the context)
  bool verbose = false;  // print the memory plan and the kernels even when stderr is not a terminal
  bool plan_on_terminal = true;  // also print them when stderr is a terminal (the CLI)
  // Expert heat counts: unset = the model folder's file in the cache folder, "" = none.
  std::optional<std::string> heat_file;
  std::string gpu = "off";    // --gpu auto|N|off
  std::string gpu_memory;     // --gpu-memory SIZE ("" = 3/4 of the device's memory)
  int64_t gpu_min_rows = 16;  // --gpu-min-rows: rows from which non-resident products go to the GPU
  // A draft model loaded next to this one (src/draft's DraftModel::weight_bytes and
  // cache_bytes_per_position): the plan counts it before trunk and experts.
  uint64_t draft_weight_bytes = 0;
  uint64_t draft_cache_bytes_per_position = 0;
  // RAM for kept prefix snapshots (PlanOptions::state_cache_bytes / state_cache_states).
  uint64_t state_cache_bytes = 0;
  int state_cache_states = 0;
};

// Read bandwidth of each drive experts come from, with O_DIRECT and `readers` threads, `bytes`
// per drive (best of `tries`): [0] the model folder's shards, then each home the model reads
// (its data files). The disk rooflines of bench, the server's engine view and /metrics use the
// sum.
std::vector<double> probe_drives(LoadedModel& m, int readers, uint64_t bytes, int tries = 1);

// Applies threads and kernels, checks the folder exists, and loads it (errors say what is
// missing or wrong, naming the option).
std::unique_ptr<LoadedModel> load_model(const EngineOptions& o);
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
