// The expert store: exact results under a budget that forces evictions every pass, scattered
// experts, prefetch bookkeeping, and faults (short reads, truncated or replaced shards) that fail
// the request without harming the store.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "model/model.h"
#include "storage/expert_directory.h"
#include "storage/expert_store.h"
#include "test_util.h"

namespace deltafin {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string copy_model(const std::string& name) {
  std::string dst = test::temp_dir("store") + "/model";
  fs::copy(test::data_dir() + "/" + name + "/model", dst, fs::copy_options::recursive);
  for (auto& e : fs::directory_iterator(dst)) {
    fs::permissions(e.path(), fs::perms::owner_read | fs::perms::owner_write,
                    fs::perm_options::add);
  }
  return dst;
}

// Tiny experts (13 KiB) make O_DIRECT latency dominate, so most tests read through the page
// cache; one run keeps O_DIRECT to cover the aligned-read path.
ExpertFactory store_options(size_t slots, CachePolicy policy = CachePolicy::kLRU,
                            bool direct = false) {
  return [slots, policy, direct](const ModelConfig& c, const Checkpoint& ck, ExpertFormat f) {
    StoreOptions so;
    so.policy = policy;
    so.cache_slots = slots;
    so.direct_io = direct;
    so.readers = 3;
    return std::make_unique<ExpertStore>(c, ck, f, so);
  };
}

std::vector<float> run(Model& m, const std::vector<int32_t>& toks, int64_t split) {
  State st = m.new_state();
  std::vector<float> out;
  if (split > 0) out = m.forward(st, std::span<const int32_t>(toks.data(), split), true);
  for (size_t t = split; t < toks.size(); ++t) {
    auto r = m.forward(st, std::span<const int32_t>(toks.data() + t, 1));
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

const std::vector<int32_t> kToks = {5, 17, 200, 3, 99, 42, 7, 300, 64, 128, 1, 250, 77, 8, 400, 3};

TEST(Store, ExactUnderABudgetThatEvictsEveryPass) {
  for (const char* name : {"k3-tiny-mxfp4", "k3-tiny-bf16"}) {
    auto ref = open_model(test::data_dir() + "/" + name + "/model");
    for (CachePolicy p : {CachePolicy::kLRU, CachePolicy::kLFU}) {
      const bool direct = p == CachePolicy::kLRU && std::string(name) == "k3-tiny-mxfp4";
      auto m = open_model(test::engine_options(test::data_dir() + "/" + name + "/model"), {},
                          store_options(4, p, direct));  // top-4: minimum
      for (int64_t split : {int64_t{16}, int64_t{6}}) {
        EXPECT_EQ(run(*ref, kToks, split), run(*m, kToks, split)) << name << " split " << split;
      }
      ExpertStats s = m->experts().stats();
      EXPECT_GT(s.misses, 0u);
      EXPECT_GT(s.bytes_read, 0u);
      EXPECT_EQ(s.hits + s.misses, s.requests);
    }
  }
}

TEST(Store, MinimumCacheIsEnforced) {
  EXPECT_THROW(open_model(test::engine_options(test::data_dir() + "/k3-tiny-mxfp4/model"), {},
                          store_options(3)),
               InvalidArgument);
}

// Rewrites a shard so that every expert's w2 tensors move to the end of the data region: the
// expert's six tensors are no longer back to back.
void scatter_experts(const std::string& file) {
  std::string raw = test::slurp(file);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  json h = json::parse(raw.substr(8, n));
  const std::string data = raw.substr(8 + n);
  std::vector<std::string> first, last;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    (it.key().find(".w2.") != std::string::npos ? last : first).push_back(it.key());
  }
  std::string out_data;
  json nh = json::object();
  for (auto* list : {&first, &last}) {
    for (const auto& k : *list) {
      uint64_t b = h[k]["data_offsets"][0], e = h[k]["data_offsets"][1];
      json t = h[k];
      t["data_offsets"] = {out_data.size(), out_data.size() + (e - b)};
      out_data += data.substr(b, e - b);
      nh[k] = t;
    }
  }
  std::string hs = nh.dump();
  while (hs.size() % 8) hs.push_back(' ');
  uint64_t m = hs.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &m, 8);
  test::spit(file, out + hs + out_data);
}

TEST(Store, ScatteredExpertsReadOneRangeAtATime) {
  auto dir = copy_model("k3-tiny-mxfp4");
  for (auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") scatter_experts(e.path().string());
  }
  auto ref = open_model(test::data_dir() + "/k3-tiny-mxfp4/model");
  auto m = open_model(test::engine_options(dir), {}, store_options(5));
  EXPECT_FALSE(ExpertDirectory(m->config(), m->checkpoint(), ExpertFormat::kMXFP4)
                   .location(1, 0)
                   .contiguous());
  EXPECT_EQ(run(*ref, kToks, 16), run(*m, kToks, 16));
}

TEST(Store, PrefetchHintsAreUsedAndCounted) {
  auto c = load_config(test::data_dir() + "/k3-tiny-mxfp4/model");
  auto ck = Checkpoint::open(test::data_dir() + "/k3-tiny-mxfp4/model");
  StoreOptions so;
  so.cache_bytes = 64ull << 20;
  ExpertStore store(c, *ck, ExpertFormat::kMXFP4, so);
  const int hint[4] = {1, 2, 3, 4};
  store.prefetch(2, hint);
  const int want[4] = {2, 3, 4, 9};
  auto b = store.request(2, want);
  size_t idx;
  ExpertHandle h;
  int n = 0;
  while (b->next(idx, h)) {
    ++n;
    EXPECT_TRUE(h->w1.valid());
  }
  EXPECT_EQ(n, 4);
  ExpertStats s = store.stats();
  EXPECT_EQ(s.prefetch_issued, 4u);
  EXPECT_EQ(s.prefetch_used, 3u);
  auto r = store.recall();
  EXPECT_EQ(r[2].requested, 4u);
  EXPECT_EQ(r[2].predicted_hits, 3u);
}

// Behind a shut prediction gate, the hints the drives can read in the gap they would sit idle
// (measured from the previous layer's last expert to this layer's request) are still read; with
// no window share, none are (the gate alone).
TEST(Store, ShutGateStillReadsHintsInTheDrivesIdleGap) {
  auto c = load_config(test::data_dir() + "/k3-tiny-mxfp4/model");
  auto ck = Checkpoint::open(test::data_dir() + "/k3-tiny-mxfp4/model");
  auto issued_behind_shut_gate = [&](double share) {
    StoreOptions so;
    so.cache_bytes = 64ull << 20;
    so.gate_warmup = 1;
    so.idle_window_share = share;
    ExpertStore store(c, *ck, ExpertFormat::kMXFP4, so);
    auto drain = [&](int layer, const std::vector<int>& experts) {
      auto b = store.request(layer, experts);
      size_t idx;
      ExpertHandle h;
      while (b->next(idx, h)) {
      }
    };
    uint64_t issued = 0;
    for (int round = 0; round < 2; ++round) {
      drain(1, {0, 1, 2, 3});
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the layer computes
      const uint64_t before = store.stats().prefetch_issued;
      const int base = 8 + 4 * round;  // never predicted before: not cached
      const int hint[4] = {base, base + 1, base + 2, base + 3};
      store.prefetch(2, hint);
      issued = store.stats().prefetch_issued - before;
      drain(2, {0, 1, 2, 3});  // none predicted: recall 0, the gate shuts
      EXPECT_TRUE(store.recall()[2].gated);
    }
    return issued;  // in the round after the gate shut
  };
  EXPECT_GT(issued_behind_shut_gate(0.75), 0u);
  EXPECT_EQ(issued_behind_shut_gate(0.0), 0u);
}

TEST(Store, ShortReadFailsTheRequestNotTheStore) {
  auto dir = copy_model("k3-tiny-mxfp4");
  auto c = load_config(dir);
  auto ck = Checkpoint::open(dir);
  StoreOptions so;
  so.cache_bytes = 64ull << 20;
  ExpertStore store(c, *ck, ExpertFormat::kMXFP4, so);
  // Find the expert stored last in some shard, and one in another shard.
  int bad_l = -1, bad_e = -1, good_l = -1, good_e = -1, other_l = -1, other_e = -1;
  uint64_t best = 0;
  for (int l = 1; l < 9; ++l) {
    for (int e = 0; e < 32; ++e) {
      auto loc = store.locate(l, e);
      if (loc.ranges[0].shard == 0 && loc.ranges[0].offset >= best) {
        best = loc.ranges[0].offset, bad_l = l, bad_e = e;
      }
      if (loc.ranges[0].shard == 1) {
        other_l = good_l, other_e = good_e;
        good_l = l, good_e = e;
      }
    }
  }
  ASSERT_GE(bad_l, 0);
  ASSERT_GE(good_l, 0);
  const std::string shard0 = ck->shards()[0].path();
  EXPECT_TRUE(store.acquire(good_l, good_e)->w1.valid());  // the files are checked now
  fs::resize_file(shard0, best + 100);  // cut the last expert short (the mapping is not touched)
  try {
    store.acquire(bad_l, bad_e);
    FAIL() << "expected a short read";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("short read"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(fs::path(shard0).filename().string()), std::string::npos)
        << e.what();
  }
  // Within the same second other experts still work; then the changed file is reported.
  ASSERT_GE(other_l, 0);
  EXPECT_NO_THROW(store.acquire(other_l, other_e));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  try {
    store.acquire(good_l, good_e);
    FAIL() << "expected the changed file to be reported";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("was replaced or changed while running"),
              std::string::npos)
        << e.what();
  }
}

TEST(Store, ReplacedFileIsReported) {
  auto dir = copy_model("k3-tiny-mxfp4");
  auto c = load_config(dir);
  auto ck = Checkpoint::open(dir);
  StoreOptions so;
  so.cache_bytes = 64ull << 20;
  ExpertStore store(c, *ck, ExpertFormat::kMXFP4, so);
  EXPECT_TRUE(store.acquire(1, 0)->w1.valid());
  const std::string shard = ck->shards()[1].path();
  std::string bytes = test::slurp(shard);
  test::spit(shard + ".new", bytes);
  fs::rename(shard + ".new", shard);  // a new inode under the same name
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_THROW(store.acquire(1, 1), IoError);
}

}  // namespace
}  // namespace deltafin
