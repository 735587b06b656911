// `deltafin doctor`'s report in plain sentences, written from the same JSON --json prints, so the
// two cannot say different things.
#include <fmt/format.h>

#include "cli/common.h"
#include "cli/doctor.h"

namespace deltafin::cli {

namespace {

using ojson = nlohmann::ordered_json;

double num(const ojson& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}
std::string str(const ojson& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

// Decimal units for disk and bandwidth (as drives are sold, disk_bytes), binary for RAM.
std::string speed(double s_per_token) {
  if (s_per_token <= 0) return "-";
  if (s_per_token >= 1) return fmt::format("{:.2f} s/token", s_per_token);
  return fmt::format("{:.2f} tokens/s ({:.3f} s/token)", 1.0 / s_per_token, s_per_token);
}

void machine(std::string& o, const ojson& m) {
  o += fmt::format("machine\n  CPU        {} ({}); kernels {}, {} threads\n", str(m, "cpu"),
                   str(m, "cpu_features"), str(m, "kernels"), num(m, "threads"));
  const double cg = num(m, "cgroup_limit_bytes");
  o += fmt::format("  memory     {} RAM, {}; memory budget {}{}\n",
                   human_bytes(num(m, "memory_bytes")),
                   cg > 0 ? "cgroup limit " + human_bytes(cg) : std::string("no cgroup limit"),
                   human_bytes(num(m, "memory_budget_bytes")),
                   m["memory_budget_default"].get<bool>() ? " (the default: 75% of the smaller)"
                                                          : " (--memory-budget)");
  const double bw = num(m, "disk_read_bytes_per_s");
  o += fmt::format("  disk       {}: {} free; read {}\n", str(m, "dir"),
                   disk_bytes(num(m, "disk_free_bytes")),
                   bw > 0 ? fmt::format("{}/s ({})", disk_bytes(bw), str(m, "disk_probe"))
                          : str(m, "disk_probe"));
  if (m.contains("homes")) {
    for (const auto& h : m["homes"]) {
      o += h["used"].get<bool>()
               ? fmt::format(
                     "  home       {}: {:.0f} experts ({:.0f}% of them); read {}/s (place's "
                     "probe)\n",
                     str(h, "dir"), num(h, "experts"), 100 * num(h, "expert_share"),
                     disk_bytes(num(h, "read_bytes_per_s")))
               : fmt::format("  home       {}: not used: {}\n", str(h, "dir"), str(h, "why"));
    }
  }
  if (m["gpus"].empty()) {
    o += fmt::format("  GPU        none ({})\n", str(m, "gpu_note"));
  } else {
    for (const auto& g : m["gpus"]) o += fmt::format("  GPU        {}\n", str(g, "describe"));
  }
}

void checkpoint(std::string& o, const ojson& c, const char* title) {
  o += fmt::format("{}\n", title);
  o += fmt::format("  shards     {} of {} present, {}; {} tensors read from their headers\n",
                   num(c, "shards_present"), num(c, "shards_expected"), disk_bytes(num(c, "bytes")),
                   num(c, "tensors"));
  if (c.contains("inventory") && c["inventory"].is_object()) {
    const ojson& inv = c["inventory"];
    o += inv["ok"].get<bool>()
             ? fmt::format("  tensors    {} match the config\n", num(inv, "checked"))
             : std::string("  tensors    do NOT match the config (below)\n");
  }
  if (c.contains("kind")) o += fmt::format("  drafter    {}\n", str(c, "describe"));
  if (c["verified"].get<bool>()) {
    o += fmt::format("  verify     read {} in {:.1f} s: {}\n", disk_bytes(num(c, "bytes_verified")),
                     num(c, "verify_seconds"),
                     c["unreadable"].empty()
                         ? "every byte readable"
                         : fmt::format("{} unreadable region(s)", c["unreadable"].size()));
  }
  if (c.contains("hashes") && c["hashes"].is_object()) {
    o += fmt::format("  hashes     {} files checked against the hashes the hub listed ({}): {}\n",
                     num(c["hashes"], "checked"), str(c["hashes"], "manifest"),
                     c["hashes"]["mismatched"].empty() ? "all match" : "MISMATCHES below");
  }
  for (const auto& p : c["problems"]) o += fmt::format("  PROBLEM    {}\n", p.get<std::string>());
  for (const auto& u : c["unreadable"]) {
    std::string names;
    for (const auto& t : u["tensors"]) {
      if (names.size() > 160) {
        names += ", ...";
        break;
      }
      names += (names.empty() ? "" : ", ") + t.get<std::string>();
    }
    o += fmt::format("  UNREADABLE {} bytes [{}, {}): {}{}\n", str(u, "file"), num(u, "offset"),
                     num(u, "offset") + num(u, "length"), str(u, "error"),
                     names.empty() ? "" : "; holds " + names);
  }
  if (c["problems"].empty() && c["unreadable"].empty()) o += "  result     OK\n";
}

}  // namespace

std::string doctor_text(const ojson& r) {
  std::string o;
  machine(o, r["machine"]);
  const ojson& m = r["model"];
  o += fmt::format("\nmodel        {}", str(m, "name"));
  if (m.contains("layers")) {
    o += fmt::format(" ({}): {} layers, hidden {}, {} experts (top {}), vocab {}\n",
                     str(m, "source"), num(m, "layers"), num(m, "hidden"), num(m, "experts"),
                     num(m, "top_k"), num(m, "vocab"));
    if (num(m, "disk_needed_bytes") > 0) {
      o += fmt::format("  disk       {} needed, {} free in {}: {}\n",
                       disk_bytes(num(m, "disk_needed_bytes")),
                       disk_bytes(num(r["machine"], "disk_free_bytes")), str(r["machine"], "dir"),
                       m["fits_on_disk"].get<bool>() ? "enough" : "NOT enough");
    }
  } else {
    o += "\n";
  }
  if (r.contains("plan")) {
    const ojson& p = r["plan"];
    if (p.contains("error")) {
      o += fmt::format("  plan       {}\n", str(p, "error"));
    } else {
      o += fmt::format(
          "  plan       budget {}: fixed {}; trunk {} of {} units resident ({}), {} streamed per "
          "token; expert cache {} experts ({:.1f}% of all {})\n",
          human_bytes(num(p, "budget_bytes")), human_bytes(num(p, "fixed_bytes")),
          num(p, "trunk_units_resident"), num(p, "trunk_units"),
          human_bytes(num(p, "trunk_resident_bytes")),
          disk_bytes(num(p, "trunk_streamed_bytes_per_pass")), num(p, "expert_cache_experts"),
          100 * num(p, "expert_cache_share"), disk_bytes(num(p, "all_experts_bytes")));
    }
  }
  if (r.contains("speeds")) {
    const ojson& s = r["speeds"];
    // The experts' own format (the mxfp4_* fields hold it for every family).
    const std::string xf = s.contains("expert_format") ? str(s, "expert_format") : "MXFP4";
    o += fmt::format(
        "  measured   memory {}/s; one-row products: BF16 {}/s, {} {}/s, int8 {}/s; {} rows: "
        "BF16 {:.1f} GFLOP/s; {} at {} rows {:.1f} GFLOP/s (FMA peak {:.1f})\n",
        disk_bytes(num(s, "memory_bandwidth_bytes_per_s")),
        disk_bytes(num(s, "bf16_gemv_bytes_per_s")), xf,
        disk_bytes(num(s, "mxfp4_gemv_bytes_per_s")), disk_bytes(num(s, "int8_gemv_bytes_per_s")),
        num(s, "trunk_rows"), num(s, "bf16_gemm_flops_per_s") / 1e9, xf, num(s, "expert_rows"),
        num(s, "mxfp4_gemm_flops_per_s") / 1e9, num(s, "fma_peak_flops_per_s") / 1e9);
  }
  if (r.contains("forecasts")) {
    for (const auto& f : r["forecasts"]) {
      const std::string name = str(f, "name");
      if (f.contains("error")) {
        o += fmt::format("  {:<10} {}: {}\n", name, str(f, "drafter"), str(f, "error"));
        continue;
      }
      if (name == "bf16") {
        o += fmt::format(
            "  per token  {} read from disk, {} of weights touched ({:.0f} experts, hit rate "
            "{:.1f}%)\n",
            disk_bytes(num(f, "bytes_read_per_token")),
            disk_bytes(num(f, "bytes_touched_per_token")), num(f, "experts_per_token"),
            100 * num(f, "expert_hit_rate"));
        o += fmt::format(
            "  forecast   decode {}, {}-bound; prefill {:.2f} tokens/s for a {}-token prompt "
            "({} passes)\n",
            speed(num(f, "decode_s_per_token")), str(f, "decode_bound"),
            num(f, "prefill_tokens_per_s"), num(f, "prompt_tokens"), num(f, "prefill_passes"));
      } else if (name == "trunk_int8") {
        o += fmt::format("  int8 trunk decode {}; prefill {:.2f} tokens/s (--trunk int8, lossy)\n",
                         speed(num(f, "decode_s_per_token")), num(f, "prefill_tokens_per_s"));
      } else {
        o += fmt::format(
            "  drafter    decode {} with {} at {} drafts per pass and {:.2f} tokens per pass "
            "(its documented acceptance)\n",
            speed(num(f, "draft_s_per_token")), str(f, "drafter"), num(f, "drafts_per_pass"),
            num(f, "tokens_per_pass"));
      }
    }
  }
  if (r.contains("vision")) o += doctor_vision_text(r["vision"]);
  if (r.contains("advice")) {
    const ojson& a = r["advice"];
    const std::string best = str(a, "best");
    for (const auto& opt : a["options"]) {
      if (str(opt, "change") == best) {
        o += fmt::format("  would help most: {}: decode {} ({:.2f}x)\n", str(opt, "text"),
                         speed(num(opt, "decode_s_per_token")), num(opt, "speedup"));
      }
    }
    if (best == "none") {
      o += "  would help most: none of more RAM, a second drive or the int8 trunk gains 5%: the "
           "CPU's compute bounds it\n";
    } else if (best == "more_ram" && a["options"].empty()) {
      o += "  would help most: more RAM (the budget is below the minimum working set)\n";
    }
  }
  if (r["checkpoint"].is_object()) {
    o += "\n";
    checkpoint(o, r["checkpoint"], "checkpoint");
    if (r["checkpoint"]["draft"].is_object()) {
      o += "\n";
      checkpoint(o, r["checkpoint"]["draft"], "draft/");
    }
  }
  return o;
}

}  // namespace deltafin::cli
