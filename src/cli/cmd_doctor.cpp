// `deltafin doctor [--model DIR] [--dir PATH] [--json] [--verify]`: the machine, the plan and
// the forecast for Kimi K3 (its released shape, known without the checkpoint) or for a checkpoint
// folder, the change that would help most, and with --model a check of every shard (--verify:
// every byte) and of its draft/ folder. Exits 1 after the report when the checkpoint has a
// problem. docs/DOCTOR.md documents the report and the forecast's model.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/doctor.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/json_parse.h"
#include "core/machine.h"
#include "core/mapped_file.h"
#include "core/sysinfo.h"
#include "core/thread_pool.h"
#include "doctor/forecast.h"
#include "draft/draft_inventory.h"
#include "draft/draft_model.h"
#include "gpu/gpu.h"
#include "kernels/kernels.h"
#include "model/released.h"
#include "model/vision_config.h"
#include "pull/fetch.h"
#include "storage/checkpoint.h"
#include "storage/checkpoint_check.h"
#include "storage/expert_directory.h"
#include "storage/expert_store.h"
#include "storage/home.h"
#include "storage/trunk_units.h"
#include "vision/preprocess.h"

namespace deltafin::cli {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

struct DoctorArgs {
  std::string model, dir, memory_budget, kernels;
  std::vector<std::string> homes;  // --home: homes `place` filled for --model
  std::string shape = "kimi-k3";   // the release forecast without --model
  int threads = 0, readers = 4;
  int64_t ctx = 0, prompt_tokens = 1024;
  bool json = false, verify = false;
};

// The documented acceptance doctor assumes for a drafter (docs/DOCTOR.md gives the sources):
// EAGLE-3.x verifies 5 drafts per pass and yields 4.17 tokens per pass on chat text (greedy);
// DSpark proposes its block (7 drafts) and yields 3.31.
DraftAssumption draft_assumption(bool dspark, uint64_t weight_bytes) {
  return dspark ? DraftAssumption{weight_bytes, 7, 3.31} : DraftAssumption{weight_bytes, 5, 4.17};
}

// The O_DIRECT read bandwidth of `dir`: of the checkpoint's own shards when given, else of a
// 256 MiB probe file written there (core/machine.h; removed however the probe ends).
double probe_disk(const std::vector<std::string>& shards, const std::string& dir, int readers,
                  std::string& how) {
  if (!shards.empty()) {
    how = "O_DIRECT reads of the checkpoint's shards, best of 3";
    return probe_files(shards, readers, 512ull << 20, 3);
  }
  try {
    const double bw = probe_dir(dir, dir, 256ull << 20, readers, 3);
    how = "O_DIRECT reads of a 256 MiB probe file, best of 3";
    return bw;
  } catch (const std::exception& e) {
    how = fmt::format("not measured: {}", e.what());
    return 0;
  }
}

ojson machine_json(const DoctorArgs& a, const std::string& dir, double disk_bw,
                   const std::string& disk_how) {
  ojson m;
  m["cpu"] = cpu_model_name();
  m["cpu_features"] = cpu_features().describe();
  m["kernels"] = kernels::active().name;
  m["threads"] = global_pool().size();
  m["memory_bytes"] = physical_memory_bytes();
  m["cgroup_limit_bytes"] = cgroup_memory_limit_bytes();
  m["memory_budget_bytes"] = a.memory_budget.empty()
                                 ? default_memory_budget()
                                 : parse_size(a.memory_budget, "--memory-budget");
  m["memory_budget_default"] = a.memory_budget.empty();
  m["dir"] = dir;
  m["disk_free_bytes"] = free_bytes(dir).value_or(0);
  m["disk_read_bytes_per_s"] = disk_bw;
  m["disk_probe"] = disk_how;
  ojson gpus = ojson::array();
  const gpu::Probe p = gpu::probe();
  for (const auto& d : p.devices)
    gpus.push_back({{"index", d.index},
                    {"name", d.name},
                    {"type", d.type},
                    {"memory_bytes", d.device_local_bytes},
                    {"describe", d.describe()}});
  m["gpus"] = gpus;
  m["gpu_note"] = !gpu::compiled_in() ? "this build has no Vulkan backend"
                  : p.devices.empty() ? p.error
                                      : "";
  return m;
}

ojson speeds_json(const KernelSpeeds& s) {
  return {{"bf16_gemv_bytes_per_s", s.bf16_gemv},
          {"int8_gemv_bytes_per_s", s.int8_gemv},
          {"mxfp4_gemv_bytes_per_s", s.mxfp4_gemv},
          {"bf16_gemm_flops_per_s", s.bf16_gemm},
          {"int8_gemm_flops_per_s", s.int8_gemm},
          {"mxfp4_gemm_flops_per_s", s.mxfp4_gemm},
          {"f32_gemm_flops_per_s", s.f32_gemm},
          {"trunk_rows", s.trunk_rows},
          {"trunk_shapes", s.trunk_shapes},
          {"expert_rows", s.expert_rows},
          {"pass_rows", s.pass_rows},
          {"block_rows", s.block_rows},
          {"expert_row_seconds", s.expert_row_seconds},
          {"product_overhead_s", s.product_overhead_s},
          {"memory_bandwidth_bytes_per_s", s.memory_bandwidth},
          {"fma_peak_flops_per_s", s.fma_peak},
          {"seconds", s.seconds}};
}

ojson plan_json(const MemoryPlan& p) {
  size_t resident = 0;
  for (bool r : p.resident) resident += r;
  return {{"budget_bytes", p.budget},
          {"fixed_bytes", p.fixed_bytes()},
          {"context", p.context},
          {"trunk", p.trunk == TrunkFormat::kInt8 ? "int8" : "bf16"},
          {"trunk_units", p.resident.size()},
          {"trunk_units_resident", resident},
          {"trunk_resident_bytes", p.trunk_resident_bytes},
          {"trunk_streamed_bytes_per_pass", p.streamed_bytes_per_pass()},
          {"expert_cache_bytes", p.expert_cache_bytes},
          {"expert_cache_experts",
           p.expert_slot_bytes ? p.expert_cache_bytes / p.expert_slot_bytes : 0},
          {"expert_cache_share", p.all_experts_bytes ? static_cast<double>(p.expert_cache_bytes) /
                                                           static_cast<double>(p.all_experts_bytes)
                                                     : 1.0},
          {"all_experts_bytes", p.all_experts_bytes},
          {"min_working_set_bytes", p.min_working_set},
          {"vision_weight_bytes", p.vision_weight_bytes},
          {"vision_work_bytes", p.vision_work_bytes},
          {"prefill_pass_rows", p.pass.pass_rows}};
}

ojson forecast_json(const std::string& name, const Forecast& f, int64_t prompt) {
  ojson j{{"name", name},
          {"decode_s_per_token", f.decode_s_per_token},
          {"decode_tokens_per_s", f.decode_s_per_token > 0 ? 1.0 / f.decode_s_per_token : 0.0},
          {"decode_bound", f.bound},
          {"decode_compute_s", f.decode.compute_s},
          {"decode_read_s", f.decode.read_s},
          {"bytes_read_per_token", f.decode.read_bytes},
          {"bytes_touched_per_token", f.decode.touched_bytes},
          {"experts_per_token", f.decode.experts},
          {"expert_hit_rate", f.expert_hit_rate},
          {"prompt_tokens", prompt},
          {"prefill_tokens_per_s", f.prefill_tokens_per_s},
          {"prefill_s", f.prefill.seconds},
          {"prefill_passes", f.prefill_passes},
          {"prefill_bytes_read", f.prefill.read_bytes}};
  if (f.draft_s_per_token > 0) {
    j["draft_s_per_token"] = f.draft_s_per_token;
    j["verify_pass_s"] = f.verify.seconds;
  }
  return j;
}

// The tensors a release holds, as the inventory lists them (no checkpoint on disk): its routed
// experts in their format, and FP8 trunk linears with their block scales where it has them.
TensorTable released_tensors(const ModelConfig& c) {
  TensorTable t;
  auto add_all = [&t](const auto& expected) {
    for (const auto& e : expected) {
      TensorInfo info;
      info.name = e.name;
      info.dtype = e.dtype;
      info.shape = e.shape;
      info.nbytes = static_cast<uint64_t>(info.numel()) * dtype_size(e.dtype);
      t.emplace(e.name, std::move(info));
    }
  };
  InventoryOptions o;
  o.expert_format = c.expert_format();
  o.fp8_trunk = c.fp8_trunk;
  add_all(expected_tensors(c, o));
  // K3 is released with its vision tower and projector (401 M + 46 M parameters, BF16).
  if (c.family == Family::kK3 && !c.vision_config_json.empty())
    add_all(expected_vision_tensors(vision_config_of(c)));
  return t;
}

ojson check_json(const CheckpointCheck& c) {
  size_t present = 0;
  uint64_t bytes = 0;
  for (const auto& s : c.shards) present += s.present, bytes += s.size;
  ojson u = ojson::array();
  for (const auto& r : c.unreadable)
    u.push_back({{"file", r.file},
                 {"offset", r.offset},
                 {"length", r.length},
                 {"error", r.error},
                 {"tensors", r.tensors}});
  return {{"dir", c.dir},
          {"shards_expected", c.shards.size()},
          {"shards_present", present},
          {"bytes", bytes},
          {"tensors", c.tensors.size()},
          {"problems", c.problems},
          {"verified", c.verified},
          {"bytes_verified", c.bytes_verified},
          {"verify_seconds", c.verify_seconds},
          {"unreadable", u}};
}

// Reads every byte of the folder's shards (--verify); when `deltafin pull` left a manifest,
// hashes every file it lists against the hub's hashes as it goes. Returns the "hashes" object
// (null without a manifest); a mismatch is one of the check's problems.
ojson verify_folder(CheckpointCheck& c) {
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const std::string manifest = (fs::path(c.dir) / ".deltafin-pull" / "manifest.json").string();
  std::map<std::string, ojson> listed;
  std::error_code ec;
  if (fs::exists(manifest, ec)) {
    try {
      const ojson m = parse_ordered_json(read_file(manifest), manifest);
      for (const auto& f : m.at("files")) listed[f.at("path").get<std::string>()] = f;
    } catch (const std::exception& e) {
      c.problems.push_back(fmt::format("{}: {}", manifest, json_error_text(e)));
    }
  }
  auto hasher_for = [](const ojson& f) {
    const std::string sha = f.value("sha256", "");
    return std::make_unique<pull::FileHasher>(sha.empty(), f.value("size", uint64_t{0}));
  };
  std::vector<std::unique_ptr<pull::FileHasher>> shard_hash(c.shards.size());
  for (size_t i = 0; i < c.shards.size(); ++i) {
    auto it = listed.find(c.shards[i].file);
    if (it != listed.end()) shard_hash[i] = hasher_for(it->second);
  }
  double last = -1;
  verify_checkpoint_bytes(
      c, 8ull << 20,
      [&](size_t shard, uint64_t, const uint8_t* data, size_t n) {
        if (shard_hash[shard]) shard_hash[shard]->update(data, n);
      },
      [&](uint64_t done, uint64_t total) {
        const double pct =
            total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100;
        if (tty && pct - last >= 1) {
          fmt::print(stderr, "\rverifying {}: {:.0f}%", c.dir, pct);
          last = pct;
        }
      });
  if (tty) fmt::print(stderr, "\r\033[K");
  if (listed.empty()) return nullptr;
  ojson mismatched = ojson::array();
  int checked = 0;
  for (const auto& [listed_path, f] : listed) {
    const std::string& path = listed_path;  // clang 15 cannot capture a structured binding
    const std::string want =
        f.value("sha256", "").empty() ? f.value("oid", "") : f.value("sha256", "");
    if (want.empty()) continue;
    std::string got;
    const auto shard = std::find_if(c.shards.begin(), c.shards.end(),
                                    [&](const ShardCheck& s) { return s.file == path; });
    if (shard != c.shards.end()) {
      const bool unreadable =
          std::any_of(c.unreadable.begin(), c.unreadable.end(),
                      [&](const UnreadableRegion& r) { return r.file == path; });
      if (!shard->present || unreadable) continue;  // reported already
      got = shard_hash[static_cast<size_t>(shard - c.shards.begin())]->hex();
    } else {
      const std::string full = (fs::path(c.dir) / path).string();
      if (!fs::exists(full, ec)) {
        c.problems.push_back(fmt::format("{}: listed by the pull manifest but missing", full));
        continue;
      }
      try {
        got = f.value("sha256", "").empty() ? pull::file_git_oid(full) : pull::file_sha256(full);
      } catch (const std::exception& e) {
        c.problems.push_back(e.what());
        continue;
      }
    }
    ++checked;
    if (got != want) {
      mismatched.push_back(path);
      c.problems.push_back(
          fmt::format("{}: its hash {} is not the {} the hub listed when it was pulled",
                      (fs::path(c.dir) / path).string(), got, want));
    }
  }
  return {{"manifest", manifest}, {"checked", checked}, {"mismatched", mismatched}};
}

// What doctor examines: the checkpoint given (its files, inventory, hashes and draft/ folder,
// reported in "checkpoint") or K3's released shape.
struct Examined {
  std::optional<ModelConfig> config;
  TensorTable tensors;
  std::unique_ptr<Checkpoint> ck;
  std::vector<std::string> shard_paths;
  std::shared_ptr<DraftModel> draft;
  ojson model;
  ojson checkpoint;
  bool failed = false;
};

// The draft/ folder beside a checkpoint: checked like the checkpoint and against its target.
ojson examine_draft(const DoctorArgs& a, const std::optional<ModelConfig>& config, Examined& m) {
  const fs::path dd = fs::path(a.model) / "draft";
  std::error_code ec;
  if (!fs::is_directory(dd, ec)) return nullptr;
  CheckpointCheck dc = check_checkpoint_files(dd.string());
  const ojson dh = a.verify ? verify_folder(dc) : ojson(nullptr);
  ojson dj = check_json(dc);
  dj["hashes"] = dh;
  if (dc.problems.empty() && config) {
    try {
      m.draft = open_draft_model(dd.string(), *config);
      dj["kind"] = draft_kind_name(m.draft->config().kind);
      dj["describe"] = m.draft->describe();
    } catch (const std::exception& e) {
      dc.problems.push_back(e.what());
      dj["problems"] = dc.problems;
    }
  }
  m.failed = m.failed || !dc.ok();
  return dj;
}

Examined examine_checkpoint(const DoctorArgs& a) {
  Examined m;
  require_model_folder(a.model);
  CheckpointCheck check = check_checkpoint_files(a.model);
  ojson inventory = nullptr;
  try {
    m.config = load_config(a.model);
    try {
      const InventoryReport rep = check_inventory(*m.config, check.tensors, a.model);
      inventory = {{"ok", true}, {"checked", rep.checked}};
    } catch (const std::exception& e) {
      if (check.problems.empty()) check.problems.push_back(e.what());
      inventory = {{"ok", false}, {"error", e.what()}};
    }
  } catch (const std::exception& e) {
    check.problems.push_back(e.what());
  }
  const ojson hashes = a.verify ? verify_folder(check) : ojson(nullptr);
  if (check.problems.empty()) {
    m.ck = Checkpoint::open(a.model);
    m.tensors = m.ck->tensors();
    for (const auto& sh : m.ck->shards()) m.shard_paths.push_back(sh.path());
  }
  m.checkpoint = check_json(check);
  m.checkpoint["inventory"] = inventory;
  m.checkpoint["hashes"] = hashes;
  m.failed = !check.ok();
  m.checkpoint["draft"] = examine_draft(a, m.config, m);
  m.model = {{"name", a.model}, {"source", "checkpoint"}};
  return m;
}

Examined examine_released_shape(const std::string& name) {
  Examined m;
  const ReleasedModel& rel = released_model(name);
  m.config = rel.config();
  m.tensors = released_tensors(*m.config);
  m.model = {{"name", fmt::format("{} ({}, as released)", rel.title, rel.repo)},
             {"source", "built-in shape"}};
  m.checkpoint = nullptr;
  return m;
}

// The homes given with --home, checked as `run --home` checks them (ExpertHome: the manifest, the
// checkpoint's fingerprint, every entry against the model, the data files' sizes) and left out
// with run's reason when it would leave them out; `homes_json` says which and why. A used home
// counts at the bandwidth `place` probed, times the share of the experts it holds (a home with
// half of them serves about half its bandwidth's worth of a pass's misses: the reader splits an
// expert only over the drives that hold it). Returns the bandwidth they add to expert reads.
double examine_homes(const DoctorArgs& a, const Examined& m, ojson& homes_json) {
  homes_json = ojson::array();
  if (a.homes.empty() || !m.ck || !m.config) return 0;
  const ModelConfig& c = *m.config;
  std::optional<ExpertDirectory> experts;
  std::string fingerprint, unreadable;
  try {
    experts.emplace(c, *m.ck, check_inventory(c, *m.ck).expert_format);
    fingerprint = checkpoint_fingerprint(*m.ck);
  } catch (const Error& e) {  // the checkpoint section lists what is wrong with it
    unreadable = std::string("the checkpoint's experts could not be read: ") + e.what();
  }
  const double all = static_cast<double>(c.num_moe_layers()) * c.moe.num_experts;
  double bw = 0;
  for (const std::string& dir : a.homes) {
    ojson h = {{"dir", dir}, {"used", false}};
    try {
      if (!unreadable.empty()) throw Error(unreadable);
      const ExpertHome home(dir, fingerprint, *experts, /*direct_io=*/false);
      const HomeManifest& hm = home.manifest();
      // The manifest is a file in a folder we were pointed at: a bandwidth that is not a positive
      // number (JSON has no NaN) would bend every forecast.
      if (!(hm.probe_bytes_per_s > 0 && hm.probe_bytes_per_s < 1e15)) {
        h["why"] = fmt::format(
            "its manifest records a read bandwidth of {} bytes/s (expected a positive figure "
            "below 1e15: run deltafin place again)",
            hm.probe_bytes_per_s);
      } else {
        const double share = all > 0 ? std::min(1.0, hm.experts.size() / all) : 0.0;
        h["used"] = true;
        h["experts"] = hm.experts.size();
        h["expert_share"] = share;
        h["read_bytes_per_s"] = hm.probe_bytes_per_s;
        bw += hm.probe_bytes_per_s * share;
      }
    } catch (const Error& e) {
      h["why"] = e.what();
    }
    homes_json.push_back(h);
  }
  return bw;
}

// The forecasts (this machine; the int8 trunk; a drafter: the model's own draft/ folder, else
// EAGLE-3.1 sized for this target) and the one change that would help most.
void forecast_section(const DoctorArgs& a, const Examined& m, const PlanOptions& po,
                      uint64_t weight_bytes, double disk_bw, double home_bw, DoctorReport& r) {
  const ModelConfig& c = *m.config;
  auto plan_for = [&](PlanOptions o) { return plan_memory(c, m.tensors, o); };
  const MemoryPlan plan = plan_for(po);
  r["plan"] = plan_json(plan);
  const int64_t rows = std::min(a.prompt_tokens, plan.pass.pass_rows);
  const KernelSpeeds s =
      measure_kernel_speeds(c, m.tensors, rows, plan.pass.block_rows, global_pool());
  r["speeds"] = speeds_json(s);
  // The routed experts' format the mxfp4_* rates were measured in (K3: MXFP4; K2: FP8; ...).
  const ExpertFormat xf = c.expert_format();
  r["speeds"]["expert_format"] = xf == ExpertFormat::kMXFP4  ? "MXFP4"
                                 : xf == ExpertFormat::kFP8  ? "FP8"
                                 : xf == ExpertFormat::kInt4 ? "INT4"
                                                             : "BF16";
  if (plan.vision_params > 0) r["vision"] = doctor_vision(c, plan, s, m.ck ? a.model : "");
  // Every forecast counts the --home drives; "a second drive" is one more.
  auto predict = [&](const MemoryPlan& p, double bw, const DraftAssumption* d = nullptr,
                     double extra_home_bw = 0) {
    return forecast(c, m.tensors, p, s, bw, a.prompt_tokens, d, home_bw + extra_home_bw);
  };
  const Forecast base = predict(plan, disk_bw);
  ojson fc = ojson::array();
  fc.push_back(forecast_json("bf16", base, a.prompt_tokens));
  PlanOptions p8 = po;
  p8.trunk = TrunkFormat::kInt8;
  const Forecast int8 = predict(plan_for(p8), disk_bw);
  fc.push_back(forecast_json("trunk_int8", int8, a.prompt_tokens));
  DraftAssumption da;
  std::string dname;
  if (m.draft) {
    da = draft_assumption(m.draft->config().kind == DraftKind::kDSpark, m.draft->weight_bytes());
    dname = fmt::format("{} (its draft/ folder)", draft_kind_name(m.draft->config().kind));
  } else {
    da = draft_assumption(false, draft_weight_bytes(eagle31_shape(c), /*with_embeddings=*/false));
    // K3's published drafter; for another family, a drafter of its shape (none is published).
    dname = c.family == Family::kK3 ? "EAGLE-3.1 (lightseekorg/kimi-k3-eagle3.1-mla)"
                                    : "an EAGLE-3.1-shaped drafter (none published for this model)";
  }
  PlanOptions pd = po;
  pd.shape.draft_weight_bytes = da.weight_bytes;
  pd.shape.prefill_rows = std::max<int64_t>(a.prompt_tokens, 1 + da.drafts);
  try {
    const Forecast df = predict(plan_for(pd), disk_bw, &da);
    ojson dj = forecast_json("draft", df, a.prompt_tokens);
    dj["drafter"] = dname;
    dj["drafts_per_pass"] = da.drafts;
    dj["tokens_per_pass"] = da.tokens_per_pass;
    dj["draft_weight_bytes"] = da.weight_bytes;
    fc.push_back(dj);
  } catch (const std::exception& e) {
    fc.push_back({{"name", "draft"}, {"drafter", dname}, {"error", e.what()}});
  }
  r["forecasts"] = fc;
  // The one change that would help most: twice the RAM, a second drive, the int8 trunk.
  ojson options = ojson::array();
  auto option = [&](const std::string& change, const std::string& text, const Forecast& f) {
    options.push_back(
        {{"change", change},
         {"text", text},
         {"decode_s_per_token", f.decode_s_per_token},
         {"prefill_tokens_per_s", f.prefill_tokens_per_s},
         {"speedup",
          f.decode_s_per_token > 0 ? base.decode_s_per_token / f.decode_s_per_token : 0.0}});
  };
  if (plan.budget < weight_bytes) {  // more RAM helps only while the model does not fit
    PlanOptions pr = po;
    pr.budget = po.budget * 2;
    option("more_ram", fmt::format("twice the RAM (a {} budget)", gib(pr.budget)),
           predict(plan_for(pr), disk_bw));
  }
  // A home holds routed experts, not trunk units: the trunk's reads stay on this drive.
  if (base.decode.read_bytes > 0)
    option("second_drive",
           fmt::format("{} drive as fast as this one, holding the routed experts beside this one "
                       "(`deltafin place --home`: expert reads split over the drives; the trunk "
                       "still streams from this drive)",
                       home_bw > 0 ? "another" : "a second"),
           predict(plan, disk_bw, nullptr, disk_bw));
  option("trunk_int8", "--trunk int8 (lossy: per-row int8 trunk weights)", int8);
  size_t best = 0;
  for (size_t i = 1; i < options.size(); ++i)
    if (options[i]["speedup"].get<double>() > options[best]["speedup"].get<double>()) best = i;
  const bool helps = options[best]["speedup"].get<double>() >= 1.05;
  r["advice"] = {{"best", helps ? options[best]["change"] : ojson("none")}, {"options", options}};
}

// The model's size and whether it fits, then its memory plan and forecasts on this machine.
void plan_and_forecast(const DoctorArgs& a, Examined& m, const std::string& dir, double disk_bw,
                       double home_bw, DoctorReport& r) {
  const ModelConfig& c = *m.config;
  uint64_t bytes = 0;
  for (const auto& [n, t] : m.tensors) bytes += t.nbytes;
  m.model["layers"] = c.num_layers;
  m.model["hidden"] = c.hidden;
  m.model["experts"] = c.moe.num_experts;
  m.model["top_k"] = c.moe.top_k;
  m.model["vocab"] = c.vocab;
  m.model["weight_bytes"] = bytes;
  m.model["disk_needed_bytes"] = m.ck ? 0 : bytes;
  m.model["fits_on_disk"] = m.ck != nullptr || free_bytes(dir).value_or(0) >= bytes;
  r["model"] = m.model;
  PlanOptions po;
  po.budget = r["machine"]["memory_budget_bytes"].get<uint64_t>();
  po.context = a.ctx;
  po.shape.max_rows = 0;
  po.shape.prefill_rows = a.prompt_tokens;
  po.shape.vision_threads = global_pool().size();  // each holds one attention task's scores
  // A checkpoint's tower: its working memory for the largest image of its own processor.
  if (m.ck) {
    const fs::path pre = fs::path(a.model) / "preprocessor_config.json";
    std::error_code pec;
    if (fs::exists(pre, pec)) {
      try {
        po.shape.vision_max_patches = vision::max_patches(
            vision::parse_media_proc_config(read_regular_file(pre.string()), pre.string()));
      } catch (const std::exception&) {
        // unreadable: the release's bound, and the vision section says why
      }
    }
  }
  if (m.ck && c.num_moe_layers() > 0) {
    const ExpertFormat ef = check_inventory(c, *m.ck).expert_format;
    po.expert_slot_bytes = ExpertStore::slot_bytes_for(ExpertDirectory(c, *m.ck, ef), c);
  }
  try {
    forecast_section(a, m, po, bytes, disk_bw, home_bw, r);
  } catch (const InvalidArgument& e) {  // the budget is below the minimum working set
    r["plan"] = {{"error", e.what()}};
    r["forecasts"] = ojson::array();
    r["advice"] = {{"best", "more_ram"}, {"options", ojson::array()}};
  }
}

void run_doctor(const DoctorArgs& a) {
  EngineOptions eo;
  eo.threads = a.threads;
  eo.kernels = a.kernels;
  apply_engine_options(eo);
  DoctorReport r;
  r["deltafin"] = DELTAFIN_VERSION;
  Examined m = a.model.empty() ? examine_released_shape(a.shape) : examine_checkpoint(a);
  r["checkpoint"] = m.checkpoint;
  const std::string dir = !a.dir.empty() ? a.dir : !a.model.empty() ? a.model : ".";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail_usage("--dir {} is not a folder", dir);
  std::string disk_how;
  const double disk_bw = probe_disk(a.dir.empty() ? m.shard_paths : std::vector<std::string>{}, dir,
                                    a.readers, disk_how);
  r["machine"] = machine_json(a, dir, disk_bw, disk_how);
  ojson homes;
  const double home_bw = examine_homes(a, m, homes);
  if (!a.homes.empty()) {
    r["machine"]["homes"] = homes;
    r["machine"]["homes_read_bytes_per_s"] = home_bw;
  }
  if (m.config && !m.tensors.empty()) {
    plan_and_forecast(a, m, dir, disk_bw, home_bw, r);
  } else {
    r["model"] = m.model;
  }
  r["ok"] = !m.failed;
  if (a.json) {
    fmt::print("{}\n", r.dump());
  } else {
    fmt::print("{}", doctor_text(r));
  }
  if (m.failed) throw Error("the checkpoint has problems (listed above)");
}

}  // namespace

void register_doctor(CLI::App& app) {
  auto a = std::make_shared<DoctorArgs>();
  auto* cmd = app.add_subcommand(
      "doctor",
      "Say what this machine will do with Kimi K3 (or a checkpoint): plan, forecast, checks");
  CLI::Option* model =
      cmd->add_option("--model", a->model,
                      "Checkpoint folder to check and forecast (default: the released shape of "
                      "--shape, without a checkpoint)");
  std::vector<std::string> shapes;
  for (const ReleasedModel& m : released_models()) shapes.push_back(m.name);
  cmd->add_option("--shape", a->shape, "Without --model: the released shape to forecast")
      ->capture_default_str()
      ->check(CLI::IsMember(shapes))
      ->excludes(model);
  cmd->add_option("--dir", a->dir,
                  "Folder whose free space and read bandwidth count (default: the model folder, "
                  "else the current folder)");
  cmd->add_option("--home", a->homes,
                  "With --model: a home `deltafin place` filled for it (repeatable); the "
                  "forecasts read experts from it as run --home does, at the bandwidth place "
                  "probed")
      ->needs(model);
  cmd->add_flag("--json", a->json, "Print one JSON object (docs/DOCTOR.md)");
  cmd->add_flag("--verify", a->verify,
                "With --model: also read every byte of every shard and report unreadable regions");
  cmd->add_option("--memory-budget", a->memory_budget,
                  "RAM for the model, as for run (default: 75% of RAM or of the cgroup limit)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            try {
              parse_size(v, "--memory-budget");
            } catch (const std::exception& e) {
              return e.what();
            }
            return "";
          },
          "SIZE"));
  cmd->add_option("--threads", a->threads, "Compute threads (default: one per physical core)")
      ->check(non_negative());
  cmd->add_option("--kernels", a->kernels, "Force a kernel set: scalar, avx2, avx512 or neon")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512", "neon"}));
  cmd->add_option("--readers", a->readers, "Reader threads (as for run), for the disk probe")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--ctx", a->ctx, "Context positions to plan for (default: min(model, 8192))")
      ->check(non_negative());
  cmd->add_option("--prompt-tokens", a->prompt_tokens,
                  "Prompt length the prefill forecast is for (decode is forecast after it)")
      ->capture_default_str()
      ->check(positive());
  cmd->callback([a] { run_doctor(*a); });
}

}  // namespace deltafin::cli
