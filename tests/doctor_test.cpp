// `deltafin doctor` through the real binary: the report's text and JSON structure for the
// released K3 shape and for a checkpoint, and the checkpoint checks one by one (a missing shard,
// a shard of the wrong size, a corrupt header, a mismatched config, an unreadable region found
// by --verify through the fault-injection seam, a broken draft/ folder). Whether its forecasts
// are right is a timed comparison with `bench`, so it is not here: tests/doctor_perf.py, run by
// `make test-perf` (docs/PERFORMANCE.md has its figures).
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using deltafin::test::run_deltafin;

std::string golden_copy(const std::string& name) {
  const std::string dir = deltafin::test::temp_dir(name) + "/model";
  fs::copy(deltafin::test::data_dir() + "/k3-tiny-mxfp4/model", dir, fs::copy_options::recursive);
  return dir;
}

json doctor_json(const std::vector<std::string>& extra, int want_exit) {
  std::vector<std::string> args{"doctor", "--json", "--threads", "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  const auto r = run_deltafin(args);
  EXPECT_EQ(r.exit_code, want_exit) << r.err;
  return json::parse(r.out);
}

const json& problems(const json& j) {
  return j["checkpoint"]["problems"];
}

bool mentions(const json& list, const std::string& a, const std::string& b) {
  for (const auto& p : list) {
    const std::string s = p.get<std::string>();
    if (s.find(a) != std::string::npos && s.find(b) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST(Doctor, ReleasedShapeWithoutCheckpoint) {
  const std::string dir = deltafin::test::temp_dir("doctor-k3");
  const json j = doctor_json({"--dir", dir, "--memory-budget", "64G", "--prompt-tokens", "512"}, 0);
  // The machine.
  const json& m = j["machine"];
  for (const char* k :
       {"cpu", "cpu_features", "kernels", "threads", "memory_bytes", "cgroup_limit_bytes",
        "memory_budget_bytes", "disk_free_bytes", "disk_read_bytes_per_s", "gpus"})
    EXPECT_TRUE(m.contains(k)) << k;
  EXPECT_EQ(m["memory_budget_bytes"].get<uint64_t>(), 64ull << 30);
  EXPECT_EQ(m["threads"].get<int>(), 1);
  EXPECT_EQ(m["dir"], dir);
  EXPECT_GT(m["disk_read_bytes_per_s"].get<double>(), 0);
  EXPECT_TRUE(fs::is_empty(dir)) << "the disk probe's file is removed";
  // K3 as released: its shape and its size on disk (1.56 TB, of it 1.446 TB of routed experts).
  const json& model = j["model"];
  EXPECT_EQ(model["layers"], 93);
  EXPECT_EQ(model["experts"], 896);
  EXPECT_EQ(model["top_k"], 16);
  EXPECT_EQ(model["vocab"], 163840);
  EXPECT_NEAR(model["weight_bytes"].get<double>(), 1.56e12, 0.02e12);
  EXPECT_EQ(model["disk_needed_bytes"], model["weight_bytes"]);
  EXPECT_NEAR(j["plan"]["all_experts_bytes"].get<double>(), 1.4465e12, 0.01e12);
  // A 64 GiB budget cannot hold K3's ~110 GB trunk: part of it streams, and the cache is tiny.
  EXPECT_LT(j["plan"]["trunk_units_resident"], j["plan"]["trunk_units"]);
  EXPECT_GT(j["plan"]["trunk_streamed_bytes_per_pass"].get<double>(), 0);
  // The forecasts: exact BF16, the int8 trunk, a drafter; each with its figures.
  ASSERT_EQ(j["forecasts"].size(), 3u);
  EXPECT_EQ(j["forecasts"][0]["name"], "bf16");
  EXPECT_EQ(j["forecasts"][1]["name"], "trunk_int8");
  EXPECT_EQ(j["forecasts"][2]["name"], "draft");
  const json& f = j["forecasts"][0];
  EXPECT_EQ(f["prompt_tokens"], 512);
  EXPECT_GT(f["decode_s_per_token"].get<double>(), 0);
  EXPECT_GT(f["prefill_tokens_per_s"].get<double>(), 0);
  // A decoded token reads what the cache and the resident trunk do not hold: the 16 experts of
  // each of 92 MoE layers (17.5 MB each) plus the streamed trunk, and touches all of it.
  EXPECT_NEAR(f["experts_per_token"].get<double>(), 16.0 * 92, 1e-6);
  EXPECT_GT(f["bytes_read_per_token"].get<double>(), 16 * 92 * 17e6);
  EXPECT_GT(f["bytes_touched_per_token"].get<double>(), f["bytes_read_per_token"].get<double>());
  // Which side bounds decode follows from this machine's measured speeds (a loaded host's slow
  // compute can make it compute-bound), so only its agreement with the two times is checked.
  EXPECT_EQ(
      f["decode_bound"],
      f["decode_read_s"].get<double>() >= f["decode_compute_s"].get<double>() ? "disk" : "compute");
  // int8 holds more of the trunk in the same budget, so it reads less.
  EXPECT_LT(j["forecasts"][1]["bytes_read_per_token"].get<double>(),
            f["bytes_read_per_token"].get<double>());
  EXPECT_GT(j["forecasts"][2]["tokens_per_pass"].get<double>(), 1);
  EXPECT_GT(j["forecasts"][2]["draft_s_per_token"].get<double>(), 0);
  // Advice: one of the three changes, each with its forecast.
  const std::string best = j["advice"]["best"];
  EXPECT_TRUE(best == "more_ram" || best == "second_drive" || best == "trunk_int8") << best;
  EXPECT_EQ(j["advice"]["options"].size(), 3u);
  // A second drive (a home) holds routed experts, not the trunk: its forecast still streams the
  // trunk from this drive alone, so a token takes at least that read's time.
  for (const json& o : j["advice"]["options"]) {
    if (o["change"] != "second_drive") continue;
    EXPECT_GE(o["decode_s_per_token"].get<double>() * 1.0001,
              j["plan"]["trunk_streamed_bytes_per_pass"].get<double>() /
                  m["disk_read_bytes_per_s"].get<double>())
        << o.dump();
    EXPECT_LE(o["speedup"].get<double>(), 2.0) << o.dump();
  }
  EXPECT_TRUE(j["checkpoint"].is_null());
  EXPECT_TRUE(j["ok"].get<bool>());
  // K3 is released with its vision tower: 401 M parameters (patch embedding, the 64 x 64 position
  // grid, 27 layers of norm0, wqkv [4608, 1024], wo [1024, 1536], norm1, fc0 [4096, 1024],
  // fc1 [1024, 4096], the final norm) and a 46 M projector, resident in the plan.
  const json& v = j["vision"];
  const int64_t D = 1024, Q = 1536, I = 4096;
  const int64_t tower =
      D * 3 * 14 * 14 + 64 * 64 * D + 27 * (2 * D + 3 * Q * D + D * Q + 2 * I * D) + D;
  EXPECT_EQ(v["tower_params"].get<int64_t>(), tower);
  EXPECT_NEAR(static_cast<double>(tower), 401.2e6, 0.1e6);
  EXPECT_EQ(v["projector_params"].get<int64_t>(), 4096 * 4096 + 7168 * 4096 + 7168);
  EXPECT_TRUE(v["resident"].get<bool>());
  EXPECT_EQ(v["weight_bytes"], j["plan"]["vision_weight_bytes"]);
  EXPECT_GT(v["weight_bytes"].get<double>(), 2.0 * static_cast<double>(tower));  // BF16 + copies
  EXPECT_GT(j["plan"]["vision_work_bytes"].get<double>(), 1e9);  // the largest image: ~67k patches
  EXPECT_GE(j["plan"]["fixed_bytes"].get<double>(),
            j["plan"]["vision_weight_bytes"].get<double>() +
                j["plan"]["vision_work_bytes"].get<double>());
  // Per image: the processor's token counts (docs/VISION.md §3.3) and a forecast time.
  ASSERT_EQ(v["images"].size(), 3u);
  EXPECT_EQ(v["images"][0]["tokens"], 256);   // 448 x 448: 32 x 32 patches
  EXPECT_EQ(v["images"][1]["tokens"], 1036);  // 1024 x 768: 56 x 74 patches
  EXPECT_EQ(v["images"][2]["tokens"], 2691);  // 1920 x 1080
  for (const auto& im : v["images"]) {
    EXPECT_GT(im["forecast_s"].get<double>(), 0) << im.dump();
    EXPECT_EQ(im["patches"].get<int64_t>(), 4 * im["tokens"].get<int64_t>());
  }
  // The text report says the same in sentences.
  const auto t = run_deltafin({"doctor", "--dir", dir, "--memory-budget", "64G", "--threads", "1"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  for (const char* s : {"machine", "CPU", "memory budget 64.00 GiB", "Kimi K3", "93 layers",
                        "1.56 TB needed", "vision     tower 401.2 M + projector 46.1 M parameters",
                        "1024x768: 4144 patches -> 1036 image tokens", "plan", "forecast", "decode",
                        "prefill", "int8 trunk", "EAGLE-3.1", "would help most"})
    EXPECT_NE(t.out.find(s), std::string::npos) << s << "\n" << t.out;
}

// The probe file on a drive too full for it is removed: the report says the disk was not
// measured, and the drive is left as it was (issue 39, finding 9).
TEST(Doctor, AProbeOnAFullDriveLeavesNothingBehind) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs";
  const std::string mnt = deltafin::test::temp_dir("doctor-full");
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount(dir.c_str()); }
  } unmount{mnt};
  const json j = doctor_json({"--dir", mnt, "--memory-budget", "64G"}, 0);
  const std::string how = j["machine"]["disk_probe"];
  EXPECT_NE(how.find("not measured"), std::string::npos) << how;
  EXPECT_EQ(j["machine"]["disk_read_bytes_per_s"].get<double>(), 0);
  for (const auto& e : fs::directory_iterator(mnt)) ADD_FAILURE() << "left " << e.path();
}

TEST(Doctor, BudgetBelowTheMinimumIsStated) {
  const std::string dir = deltafin::test::temp_dir("doctor-small");
  const json j = doctor_json({"--dir", dir, "--memory-budget", "1G"}, 0);
  EXPECT_NE(j["plan"]["error"].get<std::string>().find("minimum working set"), std::string::npos);
  EXPECT_EQ(j["advice"]["best"], "more_ram");
}

TEST(Doctor, GoodCheckpointPasses) {
  const std::string model = golden_copy("doctor-good");
  const json j = doctor_json({"--model", model, "--verify"}, 0);
  const json& c = j["checkpoint"];
  EXPECT_EQ(c["shards_expected"], 3);
  EXPECT_EQ(c["shards_present"], 3);
  EXPECT_TRUE(c["problems"].empty());
  EXPECT_TRUE(c["inventory"]["ok"].get<bool>());
  EXPECT_TRUE(c["verified"].get<bool>());
  EXPECT_EQ(c["bytes_verified"], c["bytes"]);
  EXPECT_TRUE(c["unreadable"].empty());
  EXPECT_TRUE(c["draft"].is_null());
  EXPECT_EQ(j["model"]["source"], "checkpoint");
  EXPECT_EQ(j["model"]["disk_needed_bytes"], 0);
  EXPECT_EQ(j["forecasts"].size(), 3u);
  EXPECT_TRUE(j["ok"].get<bool>());
}

TEST(Doctor, MissingShard) {
  const std::string model = golden_copy("doctor-missing");
  fs::remove(model + "/model-00002-of-000003.safetensors");
  const json j = doctor_json({"--model", model}, 1);
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(j["checkpoint"]["shards_present"], 2);
  EXPECT_TRUE(mentions(problems(j), "model-00002-of-000003.safetensors", "missing"));
  EXPECT_FALSE(j.contains("forecasts")) << "no forecast from a broken checkpoint";
  const auto t = run_deltafin({"doctor", "--model", model, "--threads", "1"});
  EXPECT_EQ(t.exit_code, 1);
  EXPECT_NE(t.out.find("PROBLEM"), std::string::npos) << t.out;
  EXPECT_NE(t.err.find("the checkpoint has problems"), std::string::npos) << t.err;
}

TEST(Doctor, ShardOfTheWrongSize) {
  const std::string model = golden_copy("doctor-size");
  const std::string shard = model + "/model-00001-of-000003.safetensors";
  const auto size = fs::file_size(shard);
  fs::resize_file(shard, size - 1000);
  std::ofstream(model + "/model-00003-of-000003.safetensors", std::ios::app) << "extra";
  const json j = doctor_json({"--model", model}, 1);
  EXPECT_TRUE(
      mentions(problems(j), "model-00001-of-000003.safetensors", "truncated (1000 bytes missing)"));
  EXPECT_TRUE(mentions(problems(j), "model-00003-of-000003.safetensors", "(5 bytes too many)"));
}

TEST(Doctor, CorruptHeader) {
  const std::string model = golden_copy("doctor-header");
  std::fstream f(model + "/model-00003-of-000003.safetensors",
                 std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8);
  f.write("#", 1);  // the header's opening brace
  f.close();
  const json j = doctor_json({"--model", model}, 1);
  EXPECT_TRUE(mentions(problems(j), "model-00003-of-000003.safetensors", "not valid JSON"));
}

TEST(Doctor, TensorsThatDoNotMatchTheConfig) {
  const std::string model = golden_copy("doctor-config");
  auto cfg = json::parse(deltafin::test::slurp(model + "/config.json"));
  cfg["text_config"]["num_experts"] = cfg["text_config"]["num_experts"].get<int>() * 2;
  deltafin::test::spit(model + "/config.json", cfg.dump());
  const json j = doctor_json({"--model", model}, 1);
  EXPECT_FALSE(j["checkpoint"]["inventory"]["ok"].get<bool>());
  EXPECT_FALSE(problems(j).empty());
}

TEST(Doctor, VerifyReportsAnUnreadableRegion) {
  const std::string model = golden_copy("doctor-verify");
  // The second read of --verify fails, and so does its retry: shard 2 (each shard is one read).
  ::setenv("DELTAFIN_FAULT", "kind=eio;match=verify;after=1;count=2", 1);
  const json j = doctor_json({"--model", model, "--verify"}, 1);
  ::unsetenv("DELTAFIN_FAULT");
  const json& u = j["checkpoint"]["unreadable"];
  ASSERT_EQ(u.size(), 1u) << j["checkpoint"].dump();
  EXPECT_EQ(u[0]["file"], "model-00002-of-000003.safetensors");
  EXPECT_EQ(u[0]["offset"], 0);
  EXPECT_EQ(u[0]["length"], fs::file_size(model + "/model-00002-of-000003.safetensors"));
  EXPECT_FALSE(u[0]["tensors"].empty());
  EXPECT_NE(u[0]["error"].get<std::string>().find("Input/output error"), std::string::npos);
  // Without --verify nothing reads the data, so nothing is found.
  ::setenv("DELTAFIN_FAULT", "kind=eio;match=verify;after=1;count=2", 1);
  const json plain = doctor_json({"--model", model}, 0);
  ::unsetenv("DELTAFIN_FAULT");
  EXPECT_FALSE(plain["checkpoint"]["verified"].get<bool>());
}

TEST(Doctor, DraftFolderIsChecked) {
  const std::string model = golden_copy("doctor-draft");
  const std::string eagle = deltafin::test::data_dir() + "/eagle3-tiny";
  // The golden EAGLE draft was made for the golden tiny target: it fits this model.
  fs::copy(eagle + "/model", model + "/draft", fs::copy_options::recursive);
  json j = doctor_json({"--model", model}, 0);
  const json& d = j["checkpoint"]["draft"];
  ASSERT_TRUE(d.is_object());
  EXPECT_TRUE(d["problems"].empty()) << d.dump();
  EXPECT_EQ(d["kind"], "eagle3");
  EXPECT_NE(j["forecasts"][2]["drafter"].get<std::string>().find("draft/"), std::string::npos);
  fs::resize_file(model + "/draft/model.safetensors",
                  fs::file_size(model + "/draft/model.safetensors") / 2);
  j = doctor_json({"--model", model}, 1);
  EXPECT_TRUE(mentions(j["checkpoint"]["draft"]["problems"], "model.safetensors", "truncated"));
}

// A budget that keeps the tiny model's trunk resident and streams its experts (homes hold experts
// only: at 40M the trunk streams too).
constexpr const char* kStreamingBudget = "48M";

// doctor --home (issue 37 item 5): a home `place` filled for the model counts in every forecast
// at the bandwidth place probed, for the share of the experts it holds; a home of another
// checkpoint, or a folder that is no home, is left out with the reason, as run leaves it out.
TEST(Doctor, HomesCountInTheForecast) {
  const std::string model = golden_copy("doctor-homes");
  const std::string base = deltafin::test::temp_dir("doctor-homes-h");
  const std::string home = base + "/home", other = base + "/other", none = base + "/none";
  fs::create_directories(none);
  ASSERT_EQ(
      run_deltafin({"place", "--model", model, "--home", home, "--probe-size", "1M", "--quiet"})
          .exit_code,
      0);
  ASSERT_EQ(run_deltafin({"place", "--model", deltafin::test::data_dir() + "/k3-tiny-bf16/model",
                          "--home", other, "--probe-size", "1M", "--quiet"})
                .exit_code,
            0);
  // The home's recorded bandwidth far above the model drive's, so that what it changes in the
  // forecast does not depend on this machine's disk probe (two runs probe it separately).
  const std::string manifest = home + "/deltafin-home.json";
  json mj = json::parse(deltafin::test::slurp(manifest));
  mj["probe_bytes_per_s"] = 1e14;
  deltafin::test::spit(manifest, mj.dump());
  const std::vector<std::string> common{"--model", model, "--memory-budget", kStreamingBudget};
  std::vector<std::string> with = common;
  for (const auto& h : {home, other, none}) with.insert(with.end(), {"--home", h});
  const json j = doctor_json(with, 0);
  const json& hs = j["machine"]["homes"];
  ASSERT_EQ(hs.size(), 3u) << j["machine"].dump();
  EXPECT_TRUE(hs[0]["used"].get<bool>());
  EXPECT_GT(hs[0]["experts"].get<double>(), 0);
  EXPECT_GT(hs[0]["expert_share"].get<double>(), 0);
  EXPECT_GT(hs[0]["read_bytes_per_s"].get<double>(), 0);
  EXPECT_FALSE(hs[1]["used"].get<bool>());
  EXPECT_NE(hs[1]["why"].get<std::string>().find("another checkpoint"), std::string::npos);
  EXPECT_FALSE(hs[2]["used"].get<bool>());
  EXPECT_NE(hs[2]["why"].get<std::string>().find("deltafin place"), std::string::npos)
      << hs[2]["why"];
  EXPECT_NEAR(j["machine"]["homes_read_bytes_per_s"].get<double>(),
              hs[0]["read_bytes_per_s"].get<double>() * hs[0]["expert_share"].get<double>(), 1);
  // The same machine without the home: the experts' reads take their time on the model's drive;
  // with the (very fast) home they take next to none.
  const json plain = doctor_json(common, 0);
  const json& f = j["forecasts"][0];
  const json& p = plain["forecasts"][0];
  ASSERT_GT(p["bytes_read_per_token"].get<double>(), 0) << "the budget must stream experts";
  EXPECT_EQ(f["bytes_read_per_token"], p["bytes_read_per_token"]);
  EXPECT_LT(f["decode_read_s"].get<double>(), 0.1 * p["decode_read_s"].get<double>());
  // The text says which homes count; --home needs --model.
  const auto t = run_deltafin({"doctor", "--model", model, "--memory-budget", kStreamingBudget,
                               "--threads", "1", "--home", home, "--home", other});
  EXPECT_NE(t.out.find("home       " + home + ": "), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("home       " + other + ": not used: " + other +
                       " holds experts of another checkpoint"),
            std::string::npos)
      << t.out;
  // A manifest whose bandwidth is no positive figure is not used (it would bend the forecast).
  {
    mj["probe_bytes_per_s"] = -1e12;
    deltafin::test::spit(manifest, mj.dump());
    const json neg =
        doctor_json({"--model", model, "--memory-budget", kStreamingBudget, "--home", home}, 0);
    EXPECT_FALSE(neg["machine"]["homes"][0]["used"].get<bool>());
    EXPECT_NE(neg["machine"]["homes"][0]["why"].get<std::string>().find("positive figure"),
              std::string::npos);
    EXPECT_EQ(neg["machine"]["homes_read_bytes_per_s"].get<double>(), 0);
  }
  const auto bad = run_deltafin({"doctor", "--home", home});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--home requires --model"), std::string::npos) << bad.err;
}
