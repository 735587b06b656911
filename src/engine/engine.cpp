#include "engine/engine.h"

#include <sched.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "core/file_io.h"
#include "core/log.h"
#include "core/machine.h"
#include "core/sysinfo.h"
#include "core/thread_pool.h"
#include "engine/device_experts.h"
#include "gpu/gpu.h"
#include "kernels/kernels.h"
#include "storage/expert_directory.h"
#include "storage/home.h"
#include "storage/streaming_trunk.h"
#include "storage/trunk_units.h"

namespace deltafin {

namespace {

// More compute threads than CPUs only makes them wait for each other (a pass synchronises all
// of them many times), which runs tens of times slower: cap at the CPUs this process may use.
int capped_threads(int threads) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : physical_cores();
  if (threads <= cpus || cpus <= 0) return threads;
  log_warn("{} compute threads are more than the {} CPUs this process may use; using {}", threads,
           cpus, cpus);
  return cpus;
}

// A size as it was most likely written: "1G", "512M", else bytes.
std::string size_text(uint64_t bytes) {
  for (const auto& [shift, unit] : {std::pair{40, 'T'}, {30, 'G'}, {20, 'M'}, {10, 'K'}}) {
    if (bytes > 0 && bytes % (1ull << shift) == 0) return fmt::format("{}{}", bytes >> shift, unit);
  }
  return fmt::format("{}", bytes);
}

bool prints_plan(const EngineOptions& o) {
  return o.verbose || (o.plan_on_terminal && ::isatty(STDERR_FILENO));
}

// The budgeted providers: the plan divides the budget, the streamer and the store live in it.
void make_planned_providers(const Checkpoint& ck, ExpertFormat ef, const EngineOptions& o,
                            const PlanShape& shape, bool store, ModelParts& parts,
                            std::optional<MemoryPlan>& plan) {
  const ModelConfig& c = parts.config;
  PlanOptions po;
  po.budget = o.memory_budget.value_or(0);
  po.context = o.ctx;
  po.prefetch = o.prefetch;
  po.trunk = o.trunk;
  po.trunk_read_ahead = o.trunk_read_ahead;
  po.shape = shape;
  if (c.num_moe_layers() > 0)
    po.expert_slot_bytes = ExpertStore::slot_bytes_for(ExpertDirectory(c, ck, ef), c);
  plan = plan_memory(c, ck, po);
  if (prints_plan(o)) fmt::print(stderr, "{}\n", plan->describe());
  // One gate for the model folder's drive: the trunk's read-ahead yields to the store's demand
  // reads there (storage/reader_pool.h).
  auto gate = std::make_shared<ReadGate>();
  parts.trunk = std::make_unique<StreamingTrunk>(c, ck, *plan, o.readers, o.direct_io, gate);
  if (!store || c.num_moe_layers() == 0) return;
  StoreOptions so;
  so.cache_bytes = plan->expert_cache_bytes;
  so.readers = o.readers;
  so.direct_io = o.direct_io;
  so.policy = o.cache_policy;
  so.heat_file = o.heat_file ? *o.heat_file : heat_file_for(o.model);
  so.prefetch = o.prefetch;
  so.homes = o.homes;
  so.min_read_piece = o.read_piece;
  so.model_gate = gate;
  parts.experts = std::make_unique<ExpertStore>(c, ck, ef, so);
}

}  // namespace

LoadedModel::LoadedModel(ModelParts parts, std::shared_ptr<const Checkpoint> ck,
                         InventoryReport inventory, std::optional<MemoryPlan> plan)
    : Model(std::move(parts)),
      checkpoint_(std::move(ck)),
      inventory_(inventory),
      plan_(std::move(plan)) {}

std::unique_ptr<LoadedModel> open_model(const EngineOptions& o, const PlanShape& shape,
                                        const ExpertFactory& experts) {
  const std::string& dir = o.model;
  ModelParts parts;
  parts.config = load_config(dir);
  const ModelConfig& c = parts.config;
  std::shared_ptr<const Checkpoint> ck = Checkpoint::open(dir);
  const InventoryReport inventory = check_inventory(c, *ck);
  const ExpertFormat ef = inventory.expert_format;
  std::optional<MemoryPlan> plan;
  if (o.mmap && !o.homes.empty())
    fail_setting("home", o.homes.front(),
                 "homes are read by the expert store, which memory-mapped weights (mmap) do not "
                 "use");
  if (o.mmap && o.trunk == TrunkFormat::kInt8)
    fail_setting("trunk", "int8",
                 "needs the planned store, which mapping the shards (mmap) replaces");
  if (o.mmap) {
    parts.trunk = std::make_unique<ResidentTrunk>(c, *ck);
    // No budget to size passes from: an automatic pass takes what the prompt needs.
    const int64_t ctx = plan_context(c, o.ctx);
    PassPlan& pp = parts.pass_plan;
    pp.automatic = shape.max_rows <= 0;
    pp.pass_rows = std::max<int64_t>(
        pp.automatic ? (shape.prefill_rows > 0 ? shape.prefill_rows : ctx) : shape.max_rows,
        shape.sequences);
    pp.block_rows = pass_block_rows(pp.pass_rows);
    if (prints_plan(o)) fmt::print(stderr, "[plan] {}\n", pp.describe());
  } else {
    make_planned_providers(*ck, ef, o, shape, !experts, parts, plan);
    parts.pass_plan = plan->pass;
  }
  if (experts) {
    parts.experts = experts(c, *ck, ef);
  } else if (!parts.experts) {
    parts.experts = std::make_unique<MmapExpertProvider>(c, *ck, ef);
  }
  parts.trunk_bytes_per_pass = trunk_bytes_per_pass(c, *ck);
  parts.keep_alive = ck;
  if (o.own_threads) parts.pool = std::make_unique<ThreadPool>(capped_threads(o.threads));
  std::shared_ptr<gpu::Backend> gpu;
  GpuPlan gpu_plan;
  if (o.gpu.select != "off") {
    // Units whose bytes stay put: all of them when mapped, the plan's resident ones otherwise.
    std::vector<bool> stable(static_cast<size_t>(c.num_layers) + 1, o.mmap);
    if (plan) stable = plan->resident;
    gpu = attach_gpu(o.gpu, c, *parts.trunk, stable, gpu_plan);
    fmt::print(stderr, "{}\n", gpu_plan.device);
    if (gpu) fmt::print(stderr, "{}\n", gpu_plan.describe());
    if (gpu) {
      // Every pass offers its products to the device; prefill passes' routed experts go to it
      // in grouped windows.
      parts.pass_environment = offload_environment(gpu);
      parts.experts = std::make_unique<DeviceExperts>(std::move(parts.experts), gpu);
    }
  }
  auto model = std::make_unique<LoadedModel>(std::move(parts), ck, inventory, std::move(plan));
  model->set_gpu(std::move(gpu), std::move(gpu_plan));
  return model;
}

std::vector<double> probe_drives(LoadedModel& m, int readers, uint64_t bytes, int tries) {
  std::vector<std::vector<std::string>> drives(1);
  for (const auto& s : m.checkpoint().shards()) drives[0].push_back(s.path());
  const auto sources = m.experts().stats().sources;
  for (size_t i = 1; i < sources.size(); ++i) drives.push_back(home_data_files(sources[i].name));
  std::vector<double> out;
  for (const auto& files : drives) out.push_back(probe_files(files, readers, bytes, tries));
  return out;
}

void apply_engine_options(const EngineOptions& o) {
  if (!o.own_threads) set_global_threads(capped_threads(o.threads));
  if (!o.kernels.empty()) kernels::select(o.kernels.c_str());
}

std::unique_ptr<LoadedModel> open_model(const std::string& dir) {
  EngineOptions o;
  o.model = dir;
  o.heat_file = "";
  o.plan_on_terminal = false;
  return open_model(o);
}

std::unique_ptr<LoadedModel> load_model(const EngineOptions& o, const PlanShape& shape) {
  apply_engine_options(o);
  require_model_folder(o.model);
  if (o.gpu.memory > 0 && o.gpu.select == "off")
    fail_setting("gpu memory", size_text(o.gpu.memory), "needs a GPU, and the gpu setting is off");
  if (prints_plan(o))
    fmt::print(stderr, "[engine] {} threads, {} kernels\n",
               o.own_threads ? static_cast<size_t>(o.threads) : global_pool().size(),
               kernels::active().name);
  return open_model(o, shape);
}

void require_model_folder(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir, ec))
    fail_setting("model", dir, "no such folder (expected a checkpoint folder)");
  if (!fs::is_directory(dir, ec))
    fail_setting("model", dir, "not a folder (expected a checkpoint folder)");
}

std::string heat_file_for(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string abs = fs::weakly_canonical(fs::path(model_dir), ec).string();
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : abs) h = (h ^ ch) * 1099511628211ull;
  const char* env = std::getenv("DELTAFIN_CACHE");
  const char* home = std::getenv("HOME");
  if ((env == nullptr || *env == '\0') && (home == nullptr || *home == '\0') &&
      std::getenv("XDG_CACHE_HOME") == nullptr) {
    return "";
  }
  fs::path dir = fs::path(cache_dir()) / "heat";
  try {
    make_private_dirs(dir.string());  // 0700, like every folder Deltafin makes
  } catch (const Error&) {
    return "";
  }
  return (dir / fmt::format("{:016x}.bin", h)).string();
}

std::string cache_dir() {
  if (const char* d = std::getenv("DELTAFIN_CACHE"); d != nullptr && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x)
    return std::string(x) + "/deltafin";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h)
    return std::string(h) + "/.cache/deltafin";
  fail("cannot find a cache folder: set DELTAFIN_CACHE or HOME");
}

uint64_t parse_size(const std::string& text, const std::string& what) {
  std::string t = text;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back())) != 0) t.pop_back();
  if (t.empty()) fail_setting(what, "", "empty size");
  double mult = static_cast<double>(1ull << 30);  // bare number = GiB
  char last = static_cast<char>(std::toupper(static_cast<unsigned char>(t.back())));
  if (last == 'B' && t.size() >= 2 && std::isalpha(static_cast<unsigned char>(t[t.size() - 2]))) {
    t.pop_back();
    last = static_cast<char>(std::toupper(static_cast<unsigned char>(t.back())));
  }
  if (last == 'K' || last == 'M' || last == 'G' || last == 'T') {
    mult = last == 'K'   ? 1024.0
           : last == 'M' ? 1048576.0
           : last == 'G' ? 1073741824.0
                         : 1099511627776.0;
    t.pop_back();
  }
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(t, &used);
  } catch (...) {
    used = 0;
  }
  if (used != t.size() || !(v > 0) || !std::isfinite(v)) {
    fail_setting(what, "\"" + text + "\"",
                 "not a size (expected a positive number with an optional K, M, G or T suffix, "
                 "powers of 1024; a bare number means GiB)");
  }
  return static_cast<uint64_t>(v * mult);
}

}  // namespace deltafin
