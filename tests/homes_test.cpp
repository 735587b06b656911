// Homes on several drives (issue 28): the placement decision, `deltafin place` (copies checked,
// resumable after SIGINT and SIGKILL, refused without room, --verify), reading from homes with
// logits and greedy output identical to the model folder alone whatever the placement, and the
// faults a home can have (missing at start, a damaged copy, a read error mid-run), each answered
// with one warning and the same tokens.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "model/config.h"
#include "server_util.h"
#include "storage/checkpoint.h"
#include "storage/expert_store.h"
#include "storage/home.h"
#include "storage/place.h"
#include "storage/placement.h"
#include "storage/plan.h"
#include "test_util.h"

namespace deltafin {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string model_dir() {
  return test::data_dir() + "/k3-tiny-mxfp4/model";
}

// ---------------------------------------------------------------------------------------------
// The decision

PlacementRequest uniform(size_t n, double model_bw, std::vector<double> homes) {
  PlacementRequest r;
  r.model_bandwidth = model_bw;
  r.home_bandwidth = std::move(homes);
  r.home_capacity.assign(r.home_bandwidth.size(), kNoCapacityLimit);
  r.heat.assign(n, 1.0);
  r.bytes.assign(n, 4096);
  return r;
}

TEST(Placement, SplitsExpectedBytesByBandwidth) {
  // Model folder 1, homes 1 and 2: shares 1/4, 1/4, 1/2.
  const Placement p = plan_placement(uniform(400, 1.0, {1.0, 2.0}));
  ASSERT_EQ(p.share.size(), 3u);
  EXPECT_NEAR(p.share[0], 0.25, 0.01);
  EXPECT_NEAR(p.share[1], 0.25, 0.01);
  EXPECT_NEAR(p.share[2], 0.50, 0.01);
  EXPECT_NEAR(static_cast<double>(p.homes[1].size()) / 400, 0.5, 0.01);
  EXPECT_EQ(p.replicated, 0u);
  // Each expert on at most one home.
  std::vector<int> seen(400, 0);
  for (const auto& h : p.homes) {
    for (size_t e : h) seen[e]++;
  }
  for (int s : seen) EXPECT_LE(s, 1);
}

TEST(Placement, SmallHomeHoldsTheHottest) {
  // The home is 100x faster, so its share is nearly everything, but it has room for ten.
  PlacementRequest r = uniform(100, 1.0, {100.0});
  for (size_t e = 0; e < 100; ++e) r.heat[e] = static_cast<double>(e % 10 == 3 ? 1000 : 1);
  r.home_capacity = {10 * 4096};
  const Placement p = plan_placement(r);
  ASSERT_EQ(p.homes[0].size(), 10u);
  for (size_t e : p.homes[0]) EXPECT_EQ(e % 10, 3u) << e;
  EXPECT_GT(p.share[1], 0.95);  // the ten hot ones carry nearly all the heat
}

TEST(Placement, ReplicatesTheHottestOnEveryHome) {
  PlacementRequest r = uniform(50, 1.0, {1.0, 1.0});
  for (size_t e = 0; e < 50; ++e) r.heat[e] = static_cast<double>(e);  // 49 is the hottest
  r.replicate = 0.1;
  const Placement p = plan_placement(r);
  EXPECT_EQ(p.replicated, 5u);
  for (size_t e = 45; e < 50; ++e) {
    for (const auto& h : p.homes) EXPECT_TRUE(std::count(h.begin(), h.end(), e)) << e;
  }
  double sum = 0;
  for (double s : p.share) sum += s;
  EXPECT_NEAR(sum, 1.0, 1e-9);
}

// Step 3: a home's spare room takes the hottest experts it does not hold yet, hottest first, as
// far as the spare room and its capacity go; the forecast splits a shared expert by bandwidth.
TEST(Placement, SpareRoomTakesTheHottestAgain) {
  PlacementRequest r = uniform(40, 1.0, {1.0});
  for (size_t e = 0; e < 40; ++e) r.heat[e] = static_cast<double>(e);  // 39 is the hottest
  const Placement shares = plan_placement(r);
  EXPECT_EQ(shares.spare_copies, 0u);
  std::vector<size_t> want = shares.homes[0];
  for (size_t e = 40, added = 0; e-- > 0 && added < 5;) {
    if (std::count(want.begin(), want.end(), e)) continue;
    want.push_back(e);
    ++added;
  }
  std::sort(want.begin(), want.end());
  r.spare = {5 * 4096 + 100};
  Placement p = plan_placement(r);
  EXPECT_EQ(p.homes[0], want);
  EXPECT_EQ(p.spare_copies, 5u);
  EXPECT_EQ(p.spare_bytes, 5u * 4096);
  EXPECT_NEAR(p.share[0] + p.share[1], 1.0, 1e-9);
  // Room for everything: a full copy, read half from each of two equal drives.
  r.spare = {1ull << 30};
  p = plan_placement(r);
  EXPECT_EQ(p.homes[0].size(), 40u);
  EXPECT_NEAR(p.share[1], 0.5, 1e-9);
  // The home's capacity (--budget-per-home) bounds the spare copies too.
  r.home_capacity = {(shares.homes[0].size() + 2) * 4096};
  p = plan_placement(r);
  EXPECT_EQ(p.spare_copies, 2u);
  r.spare = {1, 2};
  EXPECT_THROW(plan_placement(r), InvalidArgument);  // one spare room per home
}

TEST(Placement, RefusesInconsistentInput) {
  PlacementRequest r = uniform(4, 1.0, {1.0});
  r.bytes.pop_back();
  EXPECT_THROW(plan_placement(r), InvalidArgument);
  r = uniform(4, 0.0, {1.0});
  EXPECT_THROW(plan_placement(r), InvalidArgument);
  r = uniform(4, 1.0, {1.0});
  r.replicate = 1.5;
  EXPECT_THROW(plan_placement(r), InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Placing and reading

PlaceOptions place_options(const std::vector<std::string>& homes, double replicate = 0) {
  PlaceOptions o;
  o.model = model_dir();
  o.homes = homes;
  o.replicate = replicate;
  o.probe_bytes = 1 << 20;
  o.threads = 2;
  return o;
}

// Rewrites the bandwidths a home's manifest recorded for the model folder and for itself (what
// the reader goes by until a drive has been busy a second), whatever the probes on this disk
// measured.
void set_probes(const std::string& home, double model_bytes_per_s, double home_bytes_per_s) {
  const std::string path = home + "/" + kHomeManifestName;
  json j = json::parse(test::slurp(path));
  j["model_probe_bytes_per_s"] = model_bytes_per_s;
  j["probe_bytes_per_s"] = home_bytes_per_s;
  test::spit(path, j.dump());
}

// Makes every read prefer the homes (the model folder's recorded bandwidth becomes tiny).
void prefer_homes(const std::string& home) {
  set_probes(home, 1000.0, 1e9);
}

std::vector<std::string> fresh_homes(const std::string& name, int n) {
  const std::string base = test::temp_dir(name);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(base + "/home" + std::to_string(i));
  return out;
}

// Records the same bandwidth for the model folder and the home, so reads split evenly over them.
void equal_drives(const std::string& home) {
  set_probes(home, 1e9, 1e9);
}

// A store of 4 slots (every pass evicts) reading from `homes`.
ExpertFactory store_with_homes(const std::vector<std::string>& homes,
                               uint64_t min_piece = ExpertSources::kDefaultMinPiece) {
  return [homes, min_piece](const ModelConfig& c, const Checkpoint& ck, ExpertFormat f) {
    StoreOptions so;
    so.cache_slots = 4;
    so.direct_io = false;
    so.readers = 2;
    so.homes = homes;
    so.min_read_piece = min_piece;
    return std::make_unique<ExpertStore>(c, ck, f, so);
  };
}

const std::vector<int32_t> kToks = {5, 17, 200, 3, 99, 42, 7, 300, 64, 128, 1, 250, 77, 8, 400, 3};

std::vector<float> logits_of(Model& m) {
  State st = m.new_state();
  std::vector<float> out = m.forward(st, std::span<const int32_t>(kToks.data(), 6), true);
  for (size_t t = 6; t < kToks.size(); ++t) {
    auto r = m.forward(st, std::span<const int32_t>(kToks.data() + t, 1));
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

TEST(Homes, LogitsIdenticalWithZeroToThreeHomesAndReplicas) {
  auto ref = open_model(test::engine_options(model_dir()), {}, store_with_homes({}));
  const std::vector<float> want = logits_of(*ref);
  for (int n = 1; n <= 3; ++n) {
    for (double rep : {0.0, 0.5, kSpareRoom}) {
      const auto homes = fresh_homes("homes-exact", n);
      const PlaceResult r = place_experts(place_options(homes, rep));
      ASSERT_EQ(r.homes.size(), static_cast<size_t>(n));
      for (const auto& h : homes) prefer_homes(h);
      auto m = open_model(test::engine_options(model_dir()), {}, store_with_homes(homes));
      EXPECT_EQ(logits_of(*m), want) << n << " homes, replicate " << rep;
      const ExpertStats s = m->experts().stats();
      ASSERT_EQ(s.sources.size(), static_cast<size_t>(n + 1));
      uint64_t home_reads = 0;
      for (size_t i = 1; i < s.sources.size(); ++i) {
        EXPECT_FALSE(s.sources[i].bad) << s.sources[i].bad_reason;
        home_reads += s.sources[i].reads;
      }
      EXPECT_GT(home_reads, 0u) << n << " homes";
      if ((rep > 0 || rep == kSpareRoom) && n > 1) {
        EXPECT_GT(r.replicated, 0u);
      }
    }
  }
}

// With full copies and pieces as small as a page, every expert (7 pages here) is read from all
// drives at once, each piece landing where the model folder's read would put it.
TEST(Homes, ExpertsSplitOverEveryCopyGiveIdenticalLogits) {
  auto ref = open_model(test::engine_options(model_dir()), {}, store_with_homes({}));
  const std::vector<float> want = logits_of(*ref);
  for (int n = 1; n <= 3; ++n) {
    const auto homes = fresh_homes("homes-split", n);
    place_experts(place_options(homes, 1.0));
    for (const auto& h : homes) equal_drives(h);
    auto m = open_model(test::engine_options(model_dir()), {}, store_with_homes(homes, 4096));
    EXPECT_EQ(logits_of(*m), want) << n << " homes";
    const ExpertStats s = m->experts().stats();
    ASSERT_EQ(s.sources.size(), static_cast<size_t>(n + 1));
    for (const auto& d : s.sources) {
      EXPECT_FALSE(d.bad) << d.bad_reason;
      EXPECT_GT(d.split_reads, 0u) << d.name << " with " << n << " homes";
    }
  }
  // With the default smallest piece (1 MiB) these small experts are read whole.
  const auto homes = fresh_homes("homes-whole", 1);
  place_experts(place_options(homes, 1.0));
  equal_drives(homes[0]);
  auto m = open_model(test::engine_options(model_dir()), {}, store_with_homes(homes));
  EXPECT_EQ(logits_of(*m), want);
  for (const auto& d : m->experts().stats().sources) EXPECT_EQ(d.split_reads, 0u) << d.name;
}

TEST(Place, RerunOfTheSameRequestIsUpToDateAndVerifies) {
  const auto homes = fresh_homes("homes-rerun", 2);
  PlaceResult first = place_experts(place_options(homes, 0.25));
  uint64_t placed = 0;
  for (const auto& h : first.homes) {
    EXPECT_FALSE(h.up_to_date);
    placed += h.experts;
  }
  EXPECT_GT(placed, 0u);
  PlaceResult again = place_experts(place_options(homes, 0.25));
  for (const auto& h : again.homes) {
    EXPECT_TRUE(h.up_to_date);
    EXPECT_EQ(h.bytes_written, 0u);
  }
  for (const auto& c : verify_homes(model_dir(), homes, false)) EXPECT_TRUE(c.problems.empty());
  // Only the published data folder and the manifest are left.
  for (const auto& h : homes) {
    int entries = 0;
    for (const auto& e : fs::directory_iterator(h)) {
      const std::string name = e.path().filename().string();
      EXPECT_TRUE(name == kHomeManifestName || name.rfind("data-", 0) == 0) << name;
      EXPECT_FALSE(name.ends_with(".partial")) << name;
      ++entries;
    }
    EXPECT_EQ(entries, 2);
  }
}

TEST(Place, PartialPlacementUnderABudgetPerHome) {
  const auto homes = fresh_homes("homes-partial", 1);
  PlaceOptions o = place_options(homes);
  o.budget_per_home = 10 * 16384;
  const PlaceResult r = place_experts(o);
  ASSERT_EQ(r.homes.size(), 1u);
  EXPECT_GT(r.homes[0].experts, 0u);
  EXPECT_LE(r.homes[0].bytes, o.budget_per_home);
  prefer_homes(homes[0]);
  auto ref = open_model(test::engine_options(model_dir()), {}, store_with_homes({}));
  auto m = open_model(test::engine_options(model_dir()), {}, store_with_homes(homes));
  EXPECT_EQ(logits_of(*m), logits_of(*ref));
}

// Flips one byte in every copy a home holds.
void damage_every_copy(const std::string& home) {
  const HomeManifest m = read_home_manifest(home);
  for (const auto& e : m.experts) {
    const std::string path = home + "/" + m.data_dir() + "/" + home_layer_file(e.layer);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(e.offset + e.bytes / 2));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(static_cast<std::streamoff>(e.offset + e.bytes / 2));
    f.write(&c, 1);
  }
}

TEST(Place, VerifyNamesADamagedCopy) {
  const auto homes = fresh_homes("homes-verify", 1);
  place_experts(place_options(homes));
  auto ok = test::run_deltafin({"place", "--model", model_dir(), "--home", homes[0], "--verify"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("ok,"), std::string::npos) << ok.out;
  damage_every_copy(homes[0]);
  auto bad = test::run_deltafin({"place", "--model", model_dir(), "--home", homes[0], "--verify"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.out.find("checksum of expert"), std::string::npos) << bad.out;
  EXPECT_NE(bad.err.find("failed the check"), std::string::npos) << bad.err;
}

// ---------------------------------------------------------------------------------------------
// Through the binary: greedy output, stats and faults

// Small enough that decode reads experts on every pass.
std::string small_budget() {
  const ModelConfig c = load_config(model_dir());
  auto ck = Checkpoint::open(model_dir());
  PlanOptions o;
  o.budget = 1ull << 40;
  o.context = 256;
  return std::to_string(plan_memory(c, *ck, o).min_working_set / 1024 + 96) + "K";
}

struct Answer {
  std::vector<int> ids;
  json j;
  std::string err;
};

Answer greedy(const std::vector<std::string>& homes, const std::vector<std::string>& more = {}) {
  std::vector<std::string> args = {"run",
                                   "--model",
                                   model_dir(),
                                   "--prompt-ids",
                                   "5,17,200,3,99",
                                   "--max-new",
                                   "12",
                                   "--json",
                                   "--ctx",
                                   "256",
                                   "--memory-budget",
                                   small_budget(),
                                   "--no-direct-io",
                                   "--readers",
                                   "2"};
  for (const auto& h : homes) {
    args.push_back("--home");
    args.push_back(h);
  }
  args.insert(args.end(), more.begin(), more.end());
  auto r = test::run_deltafin(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  Answer a;
  a.err = r.err;
  a.j = json::parse(r.out);
  a.ids = a.j["completion_ids"].get<std::vector<int>>();
  return a;
}

int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

TEST(Homes, RunGivesTheSameTokensAndReportsEveryDrive) {
  const Answer plain = greedy({});
  EXPECT_FALSE(plain.j.contains("homes"));
  const auto homes = fresh_homes("homes-run", 2);
  place_experts(place_options(homes, 0.25));
  for (const auto& h : homes) prefer_homes(h);
  const Answer two = greedy(homes);
  EXPECT_EQ(two.ids, plain.ids);
  ASSERT_TRUE(two.j.contains("homes")) << two.j.dump();
  ASSERT_EQ(two.j["homes"].size(), 3u);
  EXPECT_EQ(two.j["homes"][0]["kind"], "model");
  uint64_t home_bytes = 0;
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(two.j["homes"][i]["kind"], "home");
    EXPECT_FALSE(two.j["homes"][i]["bad"].get<bool>());
    home_bytes += two.j["homes"][i]["bytes_read"].get<uint64_t>();
  }
  EXPECT_GT(home_bytes, 0u);
  EXPECT_EQ(count_of(two.err, "warning"), 0) << two.err;
}

TEST(Homes, MissingHomeAtStartWarnsOnceAndAnswers) {
  const Answer plain = greedy({});
  const auto homes = fresh_homes("homes-missing", 2);
  place_experts(place_options(homes));
  fs::remove_all(homes[1]);
  const Answer a = greedy(homes);
  EXPECT_EQ(a.ids, plain.ids);
  EXPECT_EQ(count_of(a.err, "warning"), 1) << a.err;
  EXPECT_NE(a.err.find(homes[1]), std::string::npos) << a.err;
  EXPECT_EQ(a.j["homes"].size(), 2u);  // the model folder and the home that is there
}

TEST(Homes, DamagedCopyFallsBackWithOneWarning) {
  const Answer plain = greedy({});
  const auto homes = fresh_homes("homes-damaged", 1);
  place_experts(place_options(homes));
  prefer_homes(homes[0]);
  damage_every_copy(homes[0]);
  const Answer a = greedy(homes);
  EXPECT_EQ(a.ids, plain.ids);
  EXPECT_EQ(count_of(a.err, "warning"), 1) << a.err;
  EXPECT_NE(a.err.find("checksum"), std::string::npos) << a.err;
  EXPECT_TRUE(a.j["homes"][1]["bad"].get<bool>());
  EXPECT_GE(a.j["homes"][1]["failures"].get<uint64_t>(), 1u);
}

// Flips one byte in every page of every copy but the first and the last.
void damage_every_page(const std::string& home) {
  const HomeManifest m = read_home_manifest(home);
  for (const auto& e : m.experts) {
    const std::string path = home + "/" + m.data_dir() + "/" + home_layer_file(e.layer);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    for (uint64_t at = 4096 + 2048; at + 4096 < e.bytes; at += 4096) {
      f.seekg(static_cast<std::streamoff>(e.offset + at));
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x5a);
      f.seekp(static_cast<std::streamoff>(e.offset + at));
      f.write(&c, 1);
    }
  }
}

// An expert read in pieces from the model folder and two homes, one of them damaged: the check
// after the pieces land fails, the homes' pieces are read again from the model folder, and only
// the home whose bytes differed is left out.
TEST(Homes, DamagedPieceOfASplitExpertLeavesOutOnlyThatHome) {
  const Answer plain = greedy({});
  const auto homes = fresh_homes("homes-split-damaged", 2);
  place_experts(place_options(homes, 1.0));
  for (const auto& h : homes) equal_drives(h);
  damage_every_page(homes[1]);
  const Answer a = greedy(homes, {"--read-piece", "4K"});
  EXPECT_EQ(a.ids, plain.ids);
  EXPECT_EQ(count_of(a.err, "warning"), 1) << a.err;
  EXPECT_NE(a.err.find("checksum of expert"), std::string::npos) << a.err;
  EXPECT_NE(a.err.find(homes[1]), std::string::npos) << a.err;
  EXPECT_FALSE(a.j["homes"][1]["bad"].get<bool>()) << a.j["homes"].dump();
  EXPECT_TRUE(a.j["homes"][2]["bad"].get<bool>()) << a.j["homes"].dump();
  EXPECT_GT(a.j["homes"][1]["split_reads"].get<uint64_t>(), 0u) << a.j["homes"].dump();
}

// A home written by an earlier deltafin (another layout) is left out with one warning that says
// what to do, and `place` rewrites it.
TEST(Homes, HomeOfAnEarlierFormatIsLeftOutAndPlacedAgain) {
  const Answer plain = greedy({});
  const auto homes = fresh_homes("homes-old-format", 1);
  place_experts(place_options(homes));
  const std::string path = homes[0] + "/" + kHomeManifestName;
  json j = json::parse(test::slurp(path));
  j["format"] = "deltafin-home/1";
  test::spit(path, j.dump());
  const Answer a = greedy(homes);
  EXPECT_EQ(a.ids, plain.ids);
  EXPECT_EQ(count_of(a.err, "warning"), 1) << a.err;
  EXPECT_NE(a.err.find("run deltafin place again"), std::string::npos) << a.err;
  const PlaceResult r = place_experts(place_options(homes));
  ASSERT_EQ(r.homes.size(), 1u);
  EXPECT_FALSE(r.homes[0].up_to_date);
  const Answer b = greedy(homes);
  EXPECT_EQ(b.ids, plain.ids);
  EXPECT_EQ(count_of(b.err, "warning"), 0) << b.err;
}

TEST(Homes, ReadErrorOnOneHomeMidRunFallsBackWithOneWarning) {
  const Answer plain = greedy({});
  const auto homes = fresh_homes("homes-eio", 2);
  place_experts(place_options(homes));
  for (const auto& h : homes) prefer_homes(h);
  // The 6th read from the second home fails with EIO, after the run is well under way.
  ::setenv("DELTAFIN_FAULT", ("kind=eio;after=5;match=" + homes[1]).c_str(), 1);
  const Answer a = greedy(homes);
  ::unsetenv("DELTAFIN_FAULT");
  EXPECT_EQ(a.ids, plain.ids);
  EXPECT_EQ(count_of(a.err, "is not used for the rest of this run"), 1) << a.err;
  EXPECT_FALSE(a.j["homes"][1]["bad"].get<bool>());
  EXPECT_TRUE(a.j["homes"][2]["bad"].get<bool>());
  EXPECT_GT(a.j["homes"][2]["reads"].get<uint64_t>(), 0u);  // it served reads before failing
}

TEST(Homes, AStalledReadIsHedgedOnAnotherCopy) {
  const Answer plain = greedy({});
  const auto homes = fresh_homes("homes-hedge", 1);
  place_experts(place_options(homes));
  prefer_homes(homes[0]);
  // The 3rd read from the home stalls for 2 s: compute is waiting, so it is read again from the
  // model folder, which lands first.
  ::setenv("DELTAFIN_FAULT", ("kind=slow;delay_ms=2000;after=2;match=" + homes[0]).c_str(), 1);
  const Answer a = greedy(homes);
  ::unsetenv("DELTAFIN_FAULT");
  EXPECT_EQ(a.ids, plain.ids);
  EXPECT_GE(a.j["homes"][0]["hedges"].get<uint64_t>(), 1u) << a.j["homes"].dump();
  EXPECT_GE(a.j["homes"][0]["hedge_wins"].get<uint64_t>(), 1u) << a.j["homes"].dump();
  EXPECT_FALSE(a.j["homes"][1]["bad"].get<bool>());  // slow is not broken
}

// The same with experts split over the model folder and a full copy: the stalled piece is the
// late one, the whole expert is read again from the model folder, and the stalled read lands in
// a buffer no slot owns any more (it becomes the spare only then).
TEST(Homes, AStalledPieceOfASplitExpertIsHedged) {
  const Answer plain = greedy({});
  const auto homes = fresh_homes("homes-hedge-split", 1);
  place_experts(place_options(homes, 1.0));
  equal_drives(homes[0]);
  ::setenv("DELTAFIN_FAULT", ("kind=slow;delay_ms=2000;after=2;match=" + homes[0]).c_str(), 1);
  const Answer a = greedy(homes, {"--read-piece", "4K"});
  ::unsetenv("DELTAFIN_FAULT");
  EXPECT_EQ(a.ids, plain.ids);
  EXPECT_GT(a.j["homes"][1]["split_reads"].get<uint64_t>(), 0u) << a.j["homes"].dump();
  EXPECT_GE(a.j["homes"][0]["hedges"].get<uint64_t>(), 1u) << a.j["homes"].dump();
  EXPECT_GE(a.j["homes"][0]["hedge_wins"].get<uint64_t>(), 1u) << a.j["homes"].dump();
  EXPECT_FALSE(a.j["homes"][1]["bad"].get<bool>());
}

TEST(Homes, MmapWithAHomeIsRefused) {
  const std::string home = test::temp_dir("homes-mmap");
  auto r = test::run_deltafin({"run", "--model", model_dir(), "--prompt-ids", "5", "--max-new", "1",
                               "--mmap", "--home", home});
  EXPECT_EQ(r.exit_code, 1);
  // The setting named as the CLI spells it, once.
  EXPECT_NE(r.err.find("--home " + home + ": homes are read by the expert store"),
            std::string::npos)
      << r.err;
}

TEST(Homes, ReadPieceOffTheGridIsRefused) {
  for (const char* v : {"5K", "1000"}) {  // 1000 alone is GiB, like every size: on the grid
    auto r = test::run_deltafin(
        {"run", "--model", model_dir(), "--prompt-ids", "5", "--max-new", "1", "--read-piece", v});
    if (std::string(v) == "1000") {
      EXPECT_EQ(r.exit_code, 0) << r.err;
      continue;
    }
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("--read-piece 5K: expected a multiple of 4K"), std::string::npos) << r.err;
  }
}

TEST(Homes, ServerMetricsHaveEveryDrive) {
  const std::string model = test::server_model_dir();
  const std::string home = test::temp_dir("homes-serve") + "/home";
  auto r = test::run_deltafin({"place", "--model", model, "--home", home, "--probe-size", "1M"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  test::ServerProcess srv({"--home", home, "--memory-budget", "48M", "--ctx", "256",
                           "--no-direct-io", "--state-cache", "none"},
                          model);
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto c = srv.client();
  auto done = test::post_json(*c, "/v1/completions",
                              {{"prompt", "Hello"}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(done.status, 200) << done.body;
  const auto m = test::get(*c, "/metrics");
  ASSERT_EQ(m.status, 200);
  for (const std::string& line : {std::string("deltafin_drive_bytes_read_total{drive=\"model\"} "),
                                  "deltafin_drive_reads_total{drive=\"" + home + "\"} ",
                                  "deltafin_drive_up{drive=\"" + home + "\"} 1"})
    EXPECT_NE(m.body.find(line), std::string::npos) << line << "\n" << m.body;
}

// `bench --json` out of core with a home: one object per drive with this run's probe of it, and
// the bound of item 4 (the same dimensions' decode in RAM next to the I/O roofline) with the
// ratio the run reached. The budget's cache holds one decode pass's experts of every layer (what
// the in-RAM reference needs) but not every expert, so decode still reads.
TEST(Homes, BenchReportsEveryDriveAndTheInRamBound) {
  const ModelConfig c = load_config(model_dir());
  auto ck = Checkpoint::open(model_dir());
  PlanOptions o;
  o.context = 256;
  o.budget = 1ull << 40;
  const uint64_t min_ws = plan_memory(c, *ck, o).min_working_set;
  const uint64_t need = static_cast<uint64_t>(2 * c.moe.top_k * c.num_moe_layers());
  uint64_t budget = 0;
  for (uint64_t b = min_ws; b < min_ws * 16 && budget == 0; b += 64 << 10) {
    o.budget = b;
    const MemoryPlan p = plan_memory(c, *ck, o);
    if (p.expert_slot_bytes > 0 && p.expert_cache_bytes / p.expert_slot_bytes >= need) budget = b;
  }
  ASSERT_GT(budget, 0u);
  const auto homes = fresh_homes("homes-bench", 1);
  place_experts(place_options(homes, 1.0));
  equal_drives(homes[0]);
  auto r = test::run_deltafin({"bench",
                               "--model",
                               model_dir(),
                               "--memory-budget",
                               std::to_string(budget / 1024) + "K",
                               "--ctx",
                               "256",
                               "--readers",
                               "2",
                               "--prompt-tokens",
                               "4",
                               "--gen-tokens",
                               "4",
                               "--reps",
                               "1",
                               "--draft",
                               "none",
                               "--json",
                               "--home",
                               homes[0],
                               "--read-piece",
                               "4K"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_TRUE(j.contains("homes")) << j.dump();
  ASSERT_EQ(j["homes"].size(), 2u);
  EXPECT_EQ(j["homes"][0]["kind"], "model");
  EXPECT_EQ(j["homes"][1]["kind"], "home");
  for (const auto& d : j["homes"]) {
    EXPECT_GT(d["bench_probe_bytes_per_s"].get<double>(), 0.0);
    // The measured passes' counts (differences of snapshots), split experts included.
    EXPECT_GT(d["reads"].get<uint64_t>(), 0u) << d.dump();
    EXPECT_GT(d["split_reads"].get<uint64_t>(), 0u) << d.dump();
  }
  ASSERT_GT(j["expert_bytes_read_per_token"].get<double>(), 0.0) << j.dump();
  ASSERT_TRUE(j.contains("in_ram_decode_tokens_per_s")) << j.dump();
  const double in_ram = j["in_ram_decode_tokens_per_s"].get<double>();
  const double io = j["io_roofline_tokens_per_s"].get<double>();
  EXPECT_GT(in_ram, 0.0);
  EXPECT_GT(io, 0.0);
  EXPECT_DOUBLE_EQ(j["decode_bound_tokens_per_s"].get<double>(), std::min(in_ram, io));
  EXPECT_DOUBLE_EQ(j["decode_to_bound_ratio"].get<double>(),
                   j["decode_tokens_per_s"].get<double>() / std::min(in_ram, io));
  EXPECT_GT(j["in_ram_hit_rate"].get<double>(), 0.5);
  // bench's own memory probe (256 MiB) runs before the model loads and is not counted.
  EXPECT_LE(j["peak_rss_bytes"].get<double>(), static_cast<double>(budget + kFixedOverheadBytes))
      << "budget " << budget;
}

// ---------------------------------------------------------------------------------------------
// Interrupted and refused placements

// Waits until `home` holds a journal with at least one line (copies synced), up to 60 s.
bool wait_for_journal(const std::string& home) {
  for (int i = 0; i < 600; ++i) {
    std::error_code ec;
    for (const auto& d : fs::directory_iterator(home, ec)) {
      const std::string j = d.path().string() + "/journal";
      if (d.path().string().ends_with(".partial") && fs::exists(j) && fs::file_size(j) > 0)
        return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST(Place, ResumesAfterSigintAndSigkill) {
  for (int sig : {SIGINT, SIGKILL}) {
    const auto homes = fresh_homes("homes-resume", 1);
    // Every model read takes 40 ms, so the copy is still running when the signal comes.
    ::setenv("DELTAFIN_FAULT", "kind=slow;delay_ms=40;count=0;match=expert", 1);
    test::Child child({"place", "--model", model_dir(), "--home", homes[0], "--probe-size", "1M",
                       "--threads", "2"});
    ::unsetenv("DELTAFIN_FAULT");
    ASSERT_TRUE(wait_for_journal(homes[0])) << "signal " << sig;
    child.signal(sig);
    const test::RunResult stopped = child.wait(60);
    EXPECT_NE(stopped.exit_code, 0);
    if (sig == SIGINT) {
      EXPECT_NE(stopped.err.find("run the same command again"), std::string::npos) << stopped.err;
    }
    EXPECT_FALSE(fs::exists(homes[0] + "/" + kHomeManifestName));  // nothing published
    auto again = test::run_deltafin(
        {"place", "--model", model_dir(), "--home", homes[0], "--probe-size", "1M"});
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_NE(again.err.find("continuing"), std::string::npos) << again.err;
    for (const auto& c : verify_homes(model_dir(), homes, false))
      EXPECT_TRUE(c.problems.empty()) << c.problems.front();
  }
}

TEST(Place, RefusesAHomeWithoutRoomBeforeWriting) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs";
  const std::string mnt = test::temp_dir("homes-full");
  // Room for the probe, not for the copies (the tiny model's experts take ~3.5 MiB).
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1500k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount(dir.c_str()); }
  } unmount{mnt};
  const std::string home = mnt + "/home";
  auto r =
      test::run_deltafin({"place", "--model", model_dir(), "--home", home, "--probe-size", "256K"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no room"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nothing was written"), std::string::npos) << r.err;
  for (const auto& e : fs::directory_iterator(home)) ADD_FAILURE() << "left " << e.path();
  // With a budget that fits, the same drive takes a partial placement.
  auto ok = test::run_deltafin({"place", "--model", model_dir(), "--home", home, "--probe-size",
                                "256K", "--budget-per-home", "600K"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

// The names in a folder.
std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// A home may hold the user's own folders: place removes only the folders it made, by the names it
// recorded (its earlier placement's data folder, the copy of a changed request that stopped),
// never a data-backup-2024/ or a data-mine.partial/ of the user's (issue 39, finding 3).
TEST(Place, RemovesOnlyTheFoldersItMade) {
  const auto homes = fresh_homes("homes-own", 1);
  const std::string& h = homes[0];
  const std::vector<std::string> user = {"data-backup-2024", "data-mine.partial"};
  for (const auto& u : user) {
    fs::create_directories(h + "/" + u);
    test::spit(h + "/" + u + "/notes.txt", "mine\n");
  }
  place_experts(place_options(homes));
  const std::string first = "data-" + read_home_manifest(h).placement;
  EXPECT_EQ(names_in(h), (std::set<std::string>{kHomeManifestName, first, user[0], user[1]}));
  // A changed request stops mid-copy (a read error) and leaves its copy's folder behind ...
  ::setenv("DELTAFIN_FAULT", "kind=eio;match=expert;after=8", 1);
  auto stopped = test::run_deltafin({"place", "--model", model_dir(), "--home", h, "--probe-size",
                                     "1M", "--threads", "1", "--replicate", "0.5"});
  ::unsetenv("DELTAFIN_FAULT");
  EXPECT_EQ(stopped.exit_code, 1) << stopped.err;
  std::string partial;
  for (const auto& n : names_in(h)) {
    if (n.ends_with(".partial") && n != user[1]) partial = n;
  }
  ASSERT_FALSE(partial.empty()) << "the stopped copy left no folder";
  // ... which a third request removes, and the first placement once the third is published.
  place_experts(place_options(homes, 1.0));
  const std::string third = "data-" + read_home_manifest(h).placement;
  EXPECT_NE(third, first);
  EXPECT_EQ(names_in(h), (std::set<std::string>{kHomeManifestName, third, user[0], user[1]}));
  for (const auto& u : user) EXPECT_EQ(test::slurp(h + "/" + u + "/notes.txt"), "mine\n") << u;
  for (const auto& c : verify_homes(model_dir(), homes, false)) EXPECT_TRUE(c.problems.empty());
}

// The mode bits of `path` (no link followed).
unsigned mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// What place makes is private whatever the umask: folders 0700, files 0600.
TEST(Place, WhatItWritesIsPrivate) {
  const mode_t old = ::umask(022);
  const auto homes = fresh_homes("homes-private", 1);
  place_experts(place_options(homes));
  ::umask(old);
  const std::string& h = homes[0];
  EXPECT_EQ(mode_of(h), 0700u);
  const std::string data = h + "/data-" + read_home_manifest(h).placement;
  EXPECT_EQ(mode_of(data), 0700u);
  EXPECT_EQ(mode_of(h + "/" + kHomeManifestName), 0600u);
  int files = 0;
  for (const auto& e : fs::directory_iterator(data)) {
    EXPECT_EQ(mode_of(e.path().string()), 0600u) << e.path();
    ++files;
  }
  EXPECT_GT(files, 1);  // the layers' data files and the journal
}

// place's default: each home's share, then the hottest experts again in its spare room (up to
// half its drive's free space, within --budget-per-home), said in one line; --replicate 0 gives
// the share alone.
TEST(Place, DefaultFillsSpareRoomWithTheHottest) {
  const auto homes = fresh_homes("homes-spare", 4);
  const PlaceResult shares = place_experts(place_options({homes[0]}, 0));
  EXPECT_EQ(shares.spare_copies, 0u);
  const PlaceResult full = place_experts(place_options({homes[1]}, kSpareRoom));
  ASSERT_EQ(full.homes.size(), 1u);
  // The tiny model fits many times over in half of this disk's free space: a full copy. (The
  // share part follows each run's own probes, so only the totals are compared.)
  const size_t all = place_experts(place_options({homes[3]}, 1.0)).homes[0].experts;
  EXPECT_EQ(full.homes[0].experts, all);
  EXPECT_LT(shares.homes[0].experts, all);
  EXPECT_GT(full.spare_copies, 0u);
  EXPECT_LT(full.spare_copies, all);
  for (const auto& ch : verify_homes(model_dir(), {homes[1]}, false))
    EXPECT_TRUE(ch.problems.empty()) << ch.problems.front();
  // Through the binary, capped by --budget-per-home ten experts short of a full copy: the share
  // and then the spare room stop at the cap.
  const uint64_t cap = full.homes[0].bytes - 10 * (full.homes[0].bytes / all);
  auto r = test::run_deltafin({"place", "--model", model_dir(), "--home", homes[2], "--probe-size",
                               "1M", "--budget-per-home", std::to_string(cap / 1024) + "K"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("place: spare room: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("up to 50% of each home drive's free space"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("spare room: "), std::string::npos) << r.out;
  const HomeManifest m = read_home_manifest(homes[2]);
  EXPECT_GE(m.experts.size(), all - 11);  // the cap is given in whole KiB
  EXPECT_LT(m.experts.size(), all);
}

// A probe that fails because the drive is full leaves nothing behind (issue 39, finding 9): the
// drive is not left fuller than it was, and the error says why.
TEST(Place, AProbeOnAFullDriveLeavesNothingBehind) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs";
  const std::string mnt = test::temp_dir("homes-probe-full");
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=512k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount(dir.c_str()); }
  } unmount{mnt};
  const std::string home = mnt + "/home";
  auto r =
      test::run_deltafin({"place", "--model", model_dir(), "--home", home, "--probe-size", "1M"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("cannot probe the home " + home + ": its drive is full"), std::string::npos)
      << r.err;
  for (const auto& e : fs::directory_iterator(home)) ADD_FAILURE() << "left " << e.path();
}

// ---------------------------------------------------------------------------------------------
// Emulated drives (tools/emulated-drives.sh): loop-device file systems with read limits

TEST(Drives, HomesOnThrottledLoopDrivesGiveTheSameTokens) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (loop devices, mounts, the blkio cgroup)";
  if (!fs::exists("/dev/loop-control")) GTEST_SKIP() << "no loop devices (/dev/loop-control)";
  if (!fs::exists("/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device") &&
      !fs::exists("/sys/fs/cgroup/cgroup.controllers"))
    GTEST_SKIP() << "no blkio cgroup (v1 blkio or v2 io)";
  const std::string script = test::data_dir() + "/../../tools/emulated-drives.sh";
  const std::string dir = test::temp_dir("drives") + "/emulated";
  auto sh = [](const std::string& cmd) { return std::system(cmd.c_str()); };
  if (sh(script + " up " + dir + " 32M 20M 20M > /dev/null") != 0) {
    sh(script + " down " + dir);
    GTEST_SKIP() << "tools/emulated-drives.sh could not make loop drives here";
  }
  struct Down {
    std::string cmd;
    ~Down() { std::system(cmd.c_str()); }
  } down{script + " down " + dir};
  const std::vector<std::string> homes = {dir + "/drive-0/home", dir + "/drive-1/home"};
  place_experts(place_options(homes, 0.25));
  for (const auto& h : homes) prefer_homes(h);
  const Answer plain = greedy({});
  // The run inside the drives' cgroup, where their read limits apply.
  std::vector<std::string> args = {
      "run",    "--model", model_dir(), "--prompt-ids",    "5,17,200,3,99", "--max-new", "12",
      "--json", "--ctx",   "256",       "--memory-budget", small_budget(),  "--readers", "2"};
  std::string line = script + " run " + dir + " -- " + test::binary();
  for (const auto& a : args) line += " " + a;
  for (const auto& h : homes) line += " --home " + h;
  const std::string out_file = dir + "/../run.json";
  ASSERT_EQ(sh(line + " > " + out_file), 0);
  const json j = json::parse(test::slurp(out_file));
  EXPECT_EQ(j["completion_ids"].get<std::vector<int>>(), plain.ids);
  ASSERT_EQ(j["homes"].size(), 3u);
  EXPECT_GT(j["homes"][1]["reads"].get<uint64_t>() + j["homes"][2]["reads"].get<uint64_t>(), 0u);
}

}  // namespace
}  // namespace deltafin
