// `deltafin place`: copies a model's experts to homes on other drives so a pass reads from all of
// them (storage/place.h says how), and `place --verify`, which re-checks homes against the model.
// Progress goes to stderr, the result (one line per drive) to stdout.
#include <signal.h>

#include <atomic>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "storage/place.h"

namespace deltafin::cli {

namespace {

struct PlaceArgs {
  std::string model;
  std::vector<std::string> homes;
  std::string budget_per_home;
  double replicate = kSpareRoom;
  std::string probe_size = "256M";
  int threads = 4;
  bool verify = false;
  bool quiet = false;
};

std::atomic<int> g_place_signal{0};
extern "C" void on_place_signal(int sig) {
  g_place_signal.store(sig);
}

void run_verify(const PlaceArgs& a) {
  int bad = 0;
  for (const auto& c : verify_homes(a.model, a.homes)) {
    if (c.problems.empty()) {
      fmt::print("{}: ok, {} experts ({}) check and equal the model folder's bytes\n", c.dir,
                 c.experts, human_bytes(static_cast<double>(c.bytes)));
      continue;
    }
    ++bad;
    fmt::print("{}: {} problem{}\n", c.dir, c.problems.size(), c.problems.size() == 1 ? "" : "s");
    for (size_t i = 0; i < c.problems.size() && i < 10; ++i) fmt::print("  {}\n", c.problems[i]);
    if (c.problems.size() > 10) fmt::print("  ... and {} more\n", c.problems.size() - 10);
  }
  if (bad > 0)
    fail("{} of {} home{} failed the check (run deltafin place again to rewrite them)", bad,
         a.homes.size(), a.homes.size() == 1 ? "" : "s");
}

void run_place(const PlaceArgs& a) {
  require_model_folder(a.model);
  if (a.verify) return run_verify(a);
  struct sigaction sa {};
  sa.sa_handler = on_place_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  PlaceOptions o;
  o.model = a.model;
  o.homes = a.homes;
  if (!a.budget_per_home.empty())
    o.budget_per_home = parse_size(a.budget_per_home, "--budget-per-home");
  o.replicate = a.replicate;
  o.probe_bytes = parse_size(a.probe_size, "--probe-size");
  o.threads = a.threads;
  o.heat_file = heat_file_for(a.model);
  o.interrupted = [] { return g_place_signal.load() != 0; };
  if (!a.quiet)
    o.progress = [](const std::string& line) { fmt::print(stderr, "place: {}\n", line); };
  const PlaceResult r = place_experts(o);
  if (r.model_probe_bytes_per_s > 0) {
    fmt::print("model folder {}: {:.2f} GB/s, {:.0f}% of a pass's expert bytes\n", a.model,
               r.model_probe_bytes_per_s / 1e9, 100.0 * r.model_share);
  }
  for (const auto& h : r.homes) {
    fmt::print("home {}: {:.2f} GB/s, {} experts ({}){}{}\n", h.dir, h.probe_bytes_per_s / 1e9,
               h.experts, human_bytes(static_cast<double>(h.bytes)),
               h.up_to_date
                   ? ", up to date"
                   : fmt::format(", {:.0f}% of a pass's expert bytes, {} written", 100.0 * h.share,
                                 human_bytes(static_cast<double>(h.bytes_written))),
               "");
  }
  if (r.replicated > 0)
    fmt::print("replicated: {} experts are on more than one home\n", r.replicated);
  if (r.spare_copies > 0)
    fmt::print(
        "spare room: {} more copies of the hottest experts ({}; --replicate 0 for the shares "
        "alone, --budget-per-home to cap a home)\n",
        r.spare_copies, human_bytes(static_cast<double>(r.spare_bytes)));
}

}  // namespace

void register_place(CLI::App& app) {
  auto a = std::make_shared<PlaceArgs>();
  auto* cmd = app.add_subcommand(
      "place",
      "Copy a model's experts to homes on other drives (by bandwidth and heat), or --verify them");
  cmd->add_option("--model", a->model, "Checkpoint folder (the source of truth)")->required();
  cmd->add_option("--home", a->homes, "A folder on another drive (repeatable)")->required();
  cmd->add_option("--budget-per-home", a->budget_per_home,
                  "Most bytes of copies on each home (default: no cap beyond the default's share "
                  "of free space)");
  cmd->add_option("--replicate", a->replicate,
                  "Share of the experts, hottest first, copied to every home (0 to 1; 0: each "
                  "home holds its share of the reads alone). Default: its share, then the "
                  "hottest experts again in its spare room, up to half its drive's free space")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--probe-size", a->probe_size, "Bytes each drive's bandwidth probe reads")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "Reads in flight per drive (probe and copy)")
      ->capture_default_str()
      ->check(positive());
  cmd->add_flag("--verify", a->verify,
                "Re-read every copy in the homes and check it against its checksum and the model");
  cmd->add_flag("--quiet", a->quiet, "No progress lines on stderr");
  cmd->callback([a] { run_place(*a); });
}

}  // namespace deltafin::cli
