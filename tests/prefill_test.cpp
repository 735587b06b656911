// Prompts at the bound (issue 15): the pass plan (model/pass_plan.h) and its sizing from the
// memory budget. Exactness is checked bit for bit against the uncut pass (a pass computed in
// blocks performs the same operations per row), on the golden models and on a pass mixing
// sequences; the read-once property is checked through the real binary's stats, against the
// same prompt in small chunks as the case that re-reads.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "engine/engine.h"
#include "fixtures/synthetic.h"
#include "kernels/kernels.h"
#include "model/config.h"
#include "model/pass_arena.h"
#include "storage/checkpoint.h"
#include "storage/plan.h"
#include "test_util.h"

namespace deltafin {
namespace {

using nlohmann::json;

std::string golden(const char* name) {
  return test::data_dir() + "/" + name + "/model";
}

std::vector<int32_t> ids(size_t n, uint64_t seed, int32_t range) {
  std::vector<int32_t> v(n);
  uint64_t x = seed * 2862933555777941757ull + 3037000493ull;
  for (auto& t : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(range));
  }
  return v;
}

// All-row logits of one prompt pass with the given block size.
std::vector<float> prefill_logits(Model& m, const std::vector<int32_t>& toks, int64_t block) {
  PassPlan p;
  p.pass_rows = static_cast<int64_t>(toks.size());
  p.block_rows = block;
  m.set_pass_plan(p);
  State st = m.new_state();
  return m.forward(st, toks, /*all_logits=*/true);
}

TEST(Prefill, BlocksOfAPassChangeNoLogitBit) {
  for (const char* name : {"k3-tiny-mxfp4", "k3-tiny-bf16"}) {
    EngineOptions lo = test::engine_options(golden(name));
    lo.mmap = true;
    auto m = open_model(lo);
    // 70 rows: blocks of 16 cut the sequence four times and leave a 6-row tail; 8 is below the
    // KDA chunk, so it is no block size (the pass stays whole, as with 256).
    const auto toks = ids(70, 1, 256);
    const auto whole = prefill_logits(*m, toks, 256);
    for (int64_t block : {16, 32, 64, 8}) {
      EXPECT_EQ(prefill_logits(*m, toks, block), whole) << name << " block " << block;
    }
  }
}

TEST(Prefill, BlocksCutSeveralSequencesOnlyAtTheirOwnChunks) {
  EngineOptions lo = test::engine_options(golden("k3-tiny-mxfp4"));
  lo.mmap = true;
  auto m = open_model(lo);
  const std::vector<std::vector<int32_t>> seqs = {ids(21, 2, 256), ids(3, 3, 256), ids(40, 4, 256)};
  auto run = [&](int64_t block) {
    m->set_pass_plan(PassPlan{256, block, false});
    std::vector<State> states;
    for (size_t i = 0; i < seqs.size(); ++i) states.push_back(m->new_state());
    // A first token alone, so the pass continues states that already hold a position.
    for (auto& s : states) m->forward(s, std::vector<int32_t>{7});
    std::vector<SequenceInput> in(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      in[i].state = &states[i];
      in[i].tokens = seqs[i];
      in[i].all_logits = true;
    }
    auto logits = m->forward(in);
    // and a decode step after it, which sees the caches and states the blocks left
    auto next = m->forward(states[2], std::vector<int32_t>{5});
    logits.insert(logits.end(), next.begin(), next.end());
    return logits;
  };
  const auto whole = run(256);
  EXPECT_EQ(run(16), whole);
  EXPECT_EQ(run(32), whole);
}

PlanOptions auto_plan(uint64_t budget, int64_t prompt) {
  PlanOptions o;
  o.budget = budget;
  o.shape.max_rows = 0;  // auto
  o.shape.prefill_rows = prompt;
  o.context = 2048;
  return o;
}

TEST(Prefill, AutomaticPassesGrowWithTheBudget) {
  const std::string dir = golden("k3-tiny-mxfp4");
  const ModelConfig c = load_config(dir);
  auto ck = Checkpoint::open(dir);
  const MemoryPlan big = plan_memory(c, *ck, auto_plan(1ull << 40, 1024));
  EXPECT_TRUE(big.pass.automatic);
  EXPECT_EQ(big.pass.pass_rows, 1024);  // the whole prompt in one pass
  EXPECT_EQ(big.pass.block_rows, kDefaultBlockRows);
  EXPECT_EQ(big.buffer_bytes, pass_bytes(c, 1024, kDefaultBlockRows) + 512 * 4);
  EXPECT_NE(big.describe().find("prefill passes of up to 1024 rows (auto)"), std::string::npos)
      << big.describe();
  // At the minimum working set only the smallest pass fits; between, the pass takes half of
  // the room beyond it.
  const MemoryPlan least = plan_memory(c, *ck, auto_plan(big.min_working_set, 1024));
  EXPECT_EQ(least.pass.pass_rows, kPassBlockQuantum);
  const PassRowBytes rb = pass_row_bytes(c);
  const uint64_t extra = 2 * (300 * rb.held + kDefaultBlockRows * rb.scratch);
  const MemoryPlan mid = plan_memory(c, *ck, auto_plan(big.min_working_set + extra, 1024));
  EXPECT_GE(mid.pass.pass_rows, 300);
  EXPECT_LT(mid.pass.pass_rows, 1024);
  EXPECT_LE(mid.fixed_bytes() + mid.trunk_resident_bytes + mid.stream_buffer_bytes +
                mid.expert_cache_bytes,
            mid.budget);
  // A given chunk is kept as given.
  PlanOptions given = auto_plan(1ull << 40, 1024);
  given.shape.max_rows = 100;
  const MemoryPlan g = plan_memory(c, *ck, given);
  EXPECT_FALSE(g.pass.automatic);
  EXPECT_EQ(g.pass.pass_rows, 100);
  EXPECT_EQ(g.pass.block_rows, 112);
}

// The acceptance case of issue 15: a budget that holds one MoE layer's experts but not the
// model's, a 1,024-token prompt. Auto runs it in one pass that reads every expert it needs once;
// 64-row chunks re-read them pass after pass.
TEST(Prefill, APromptAtTheBoundReadsEachExpertOnce) {
  SyntheticSpec s = synthetic_preset("tiny");
  s.layers = 5;  // 1 dense + 4 MoE layers of 64 experts of ~210 KB (no shared experts: cheaper)
  s.experts = 64;
  s.mla_layers = {4};
  s.moe_intermediate = 256;
  s.latent = 512;
  s.shared_experts = 0;
  const std::string dir = test::temp_dir("prefill_once") + "/model";
  make_model(dir, s);
  const ModelConfig c = load_config(dir);
  auto ck = Checkpoint::open(dir);
  const int64_t T = 1024;
  const MemoryPlan least = plan_memory(c, *ck, auto_plan(1ull << 40, T));
  const uint64_t layer_experts = least.expert_slot_bytes * static_cast<uint64_t>(s.experts);
  uint64_t trunk = 0;
  for (uint64_t b : least.unit_bytes) trunk += b;
  // Room for the whole prompt's pass (the planner gives passes half of what lies beyond the
  // minimum working set), the whole trunk, and a third more than one layer's experts.
  // Whole KiB: the flag takes "NK" (a bare number means GiB).
  const uint64_t budget = (least.min_working_set +
                           2 * (pass_bytes(c, T, kDefaultBlockRows) -
                                pass_bytes(c, kPassBlockQuantum, kPassBlockQuantum)) +
                           trunk + 4 * layer_experts / 3) /
                          1024 * 1024;
  const MemoryPlan p = plan_memory(c, *ck, auto_plan(budget, T));
  ASSERT_EQ(p.pass.pass_rows, T) << p.describe();
  ASSERT_GE(p.expert_cache_bytes, layer_experts) << p.describe();
  ASSERT_LT(p.expert_cache_bytes, p.all_experts_bytes) << p.describe();

  std::string prompt;
  for (int32_t t : ids(T, 9, 250)) {
    if (!prompt.empty()) prompt += ',';  // appended, not "," + string (GCC 12 -Wrestrict)
    prompt += std::to_string(t);
  }
  auto run = [&](const std::string& chunk, uint64_t b) {
    auto r =
        test::run_deltafin({"run", "--json", "--model", dir, "--prompt-ids", prompt, "--max-new",
                            "1", "--memory-budget", std::to_string(b / 1024) + "K", "--ctx", "2048",
                            "--prefill-chunk", chunk, "-v"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return std::make_pair(json::parse(r.out), r.err);
  };
  const auto [once, err] = run("auto", budget);
  EXPECT_NE(err.find("prefill passes of up to 1024 rows (auto)"), std::string::npos) << err;
  EXPECT_EQ(once["passes"], 1);
  const auto misses = once["expert_misses"].get<uint64_t>();
  const uint64_t moe_experts = static_cast<uint64_t>(s.experts * c.num_moe_layers());
  EXPECT_GT(misses, moe_experts / 2);             // 4,096 picks per layer touch nearly all 64
  EXPECT_LE(misses, moe_experts) << once.dump();  // and none is read twice
  // Bytes per prompt token: the distinct experts touched, each read once, over the prompt.
  const auto read = once["expert_bytes_read"].get<uint64_t>();
  EXPECT_GT(read, 0u);
  EXPECT_LE(read, misses * least.expert_slot_bytes);

  // The same prompt in 64-row passes with the same expert cache (the budget less what the
  // smaller passes do not hold): every pass touches nearly every expert again.
  PlanOptions o64 = auto_plan(budget, T);
  o64.shape.max_rows = 64;
  const uint64_t budget64 =
      (budget - (p.buffer_bytes - plan_memory(c, *ck, o64).buffer_bytes)) / 1024 * 1024;
  o64.budget = budget64;
  ASSERT_LE(plan_memory(c, *ck, o64).expert_cache_bytes, p.expert_cache_bytes);
  const auto [chunked, err2] = run("64", budget64);
  EXPECT_EQ(chunked["passes"], 16) << err2;
  EXPECT_GT(chunked["expert_misses"].get<uint64_t>(), 2 * misses)  // re-read pass after pass
      << err2 << chunked.dump();
  // Same prompt, same greedy token, whatever the passes.
  EXPECT_EQ(chunked["completion_ids"], once["completion_ids"]);
}

// The yardstick of prefill compute (bench's prefill roofline, the GEMM efficiency benchmark):
// every table on this CPU has an FMA loop whose result depends on its rounds, and the measured
// peak is a positive rate.
// The pass's scratch: buffers of one sub-layer are aligned and disjoint; after the first round
// the next sub-layers get the same memory back (nothing allocated, zeroed or faulted again), and
// a sub-layer larger than all before grows the arena once, after which it is one block again.
TEST(Prefill, PassArenaHandsTheSameMemoryToEachSubLayer) {
  PassArena arena;
  auto sub_layer = [&](std::vector<int64_t> sizes) {
    arena.reset();
    std::vector<float*> got;
    for (int64_t n : sizes) {
      float* p = arena.take(n);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(got.size());  // write it all
      got.push_back(p);
    }
    for (size_t b = 0; b < got.size(); ++b)  // nothing overwrote another buffer
      for (int64_t i = 0; i < sizes[b]; ++i) EXPECT_EQ(got[b][i], static_cast<float>(b));
    return got;
  };
  sub_layer({1000, 17, 5000});               // "KDA": three blocks at first
  const auto moe = sub_layer({3000, 2000});  // "MoE": one block of the KDA's total
  const auto kda = sub_layer({1000, 17, 5000});
  const auto moe2 = sub_layer({3000, 2000});
  EXPECT_EQ(moe2, moe);
  EXPECT_EQ(sub_layer({1000, 17, 5000}), kda);
  EXPECT_EQ(kda[0], moe[0]);  // one block, reused from its start by every sub-layer
  sub_layer({20000, 1});      // larger than any before: grows
  const auto after = sub_layer({1000, 17, 5000});
  EXPECT_EQ(sub_layer({20000, 1})[0], after[0]);  // and is one block again
}

TEST(Prefill, FmaPeakLoopsRunOnEveryTable) {
  for (const kernels::KernelTable* t :
       {&kernels::scalar_table(), kernels::avx2_table(), kernels::avx512_table()}) {
    if (t == nullptr) continue;
    ASSERT_NE(t->fma_loop, nullptr) << t->name;
    EXPECT_GT(t->fma_loop_flops, 0) << t->name;
    EXPECT_NE(t->fma_loop(1), t->fma_loop(1000)) << t->name;
  }
  ThreadPool pool(1);
  EXPECT_GT(kernels::fma_peak_flops(pool, 0.005), 1e6);
}

TEST(Prefill, ChunkFlagIsAutoOrAWholeNumber) {
  for (const char* bad : {"0", "-3", "big", "1.5"}) {
    auto r = test::run_deltafin(
        {"run", "--model", golden("k3-tiny-mxfp4"), "--prompt-ids", "1,2", "--prefill-chunk", bad});
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_NE(r.err.find("expected auto or a whole number >= 1"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace deltafin
