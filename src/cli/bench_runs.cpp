// The measured passes of `deltafin bench` (see bench_runs.h).
#include "cli/bench_runs.h"

#include <algorithm>
#include <numeric>

#include "cli/bench_prompt.h"
#include "core/sysinfo.h"
#include "core/timer.h"
#include "core/trace.h"
#include "generate/driver.h"
#include "storage/expert_store.h"

namespace deltafin::cli {

namespace {

int32_t argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

// The model's counters at the start of a phase, subtracted at its end.
struct PhaseStart {
  ExpertStats experts;
  TrunkStats trunk;
  uint64_t storage = 0;
  PassStats passes;
  explicit PhaseStart(Model& m)
      : experts(m.experts().stats()),
        trunk(m.trunk_stats()),
        storage(process_storage_read_bytes()),
        passes(m.pass_stats()) {}
};

void add_gpu(const gpu::Backend* gpu, const gpu::Stats& before, gpu::Stats& sum) {
  if (gpu == nullptr) return;
  const gpu::Stats now = gpu->stats();
  sum.products += now.products - before.products;
  sum.declined += now.declined - before.declined;
  sum.seconds += now.seconds - before.seconds;
  sum.flops += now.flops - before.flops;
  sum.uploaded_bytes += now.uploaded_bytes - before.uploaded_bytes;
  sum.grouped_products += now.grouped_products - before.grouped_products;
  sum.expert_bytes += now.expert_bytes - before.expert_bytes;
  sum.overlapped_bytes += now.overlapped_bytes - before.overlapped_bytes;
}

// The in-RAM reference of an out-of-core run: the same passes, with every request of a layer
// served by that layer's first n experts (n = the request's size). They stay in the store's
// cache after the first pass, so a pass computes exactly as much as a real one (the same number
// of distinct experts of the same shape, from RAM) and reads nothing: the decode speed of the
// same dimensions in RAM, measured in the same process, next to the out-of-core speed. The
// tokens differ (other experts); only the time is used.
class InRamReference : public ExpertProvider {
 public:
  explicit InRamReference(ExpertProvider& real) : real_(real) {}
  void run(const ExpertStep& step) override { run_as_ready(*this, step); }
  uint64_t expert_bytes() const override { return real_.expert_bytes(); }
  std::unique_ptr<ExpertBatch> request(int layer, std::span<const int> experts) override {
    std::vector<int> first(experts.size());
    std::iota(first.begin(), first.end(), 0);
    return real_.request(layer, first);
  }
  ExpertHandle acquire(int layer, int expert) override {
    (void)expert;
    return real_.acquire(layer, 0);
  }
  ExpertStats stats() const override { return real_.stats(); }
  std::string describe() const override { return "in-RAM reference over " + real_.describe(); }

 private:
  ExpertProvider& real_;
};

class Runner {
 public:
  Runner(LoadedEngine& engine, const BenchShape& shape)
      : model_(*engine.model),
        shape_(shape),
        prompt_(static_cast<size_t>(shape.prompt_tokens)),
        ids_(model_.config().vocab, 88172645463325252ull),
        chunk_(static_cast<size_t>(model_.pass_plan().pass_rows)),
        gpu_(model_.gpu().get()),
        draft_(engine.draft_config(drafter_)) {}

  BenchRuns run() {
    double p = 0, d = 0;
    one_run(std::min(shape_.gen_tokens, 2), p, d, false);  // warm-up: page in, fill caches
    for (int r = 0; r < shape_.reps; ++r) {
      one_run(shape_.gen_tokens, p, d, true);
      out_.prefill_tps.push_back(shape_.prompt_tokens / p);
      out_.decode_tps.push_back(shape_.gen_tokens / d);
    }
    if (in_ram_reference_applies()) in_ram_reference();
    return std::move(out_);
  }

 private:
  // One prompt and its decode; `measured` adds their counters to the totals.
  void one_run(int gen, double& prefill_s, double& decode_s, bool measured) {
    for (auto& t : prompt_) t = ids_.next();
    const int64_t V = model_.config().vocab;
    State st = model_.new_state();
    // A draft model reads the target's taps of the prompt too: attached before the prefill.
    if (drafter_) {
      drafter_->attach(st);
      draft_.attached = &st;
    }
    gpu::Stats g0 = gpu_ != nullptr ? gpu_->stats() : gpu::Stats{};
    const PhaseStart pre0(model_);
    Stopwatch sw;
    std::vector<float> logits;
    {
      // The phases as bench times them, for a trace (docs/TRACING.md): `measured` 0 is the
      // warm-up or the in-RAM reference.
      TraceSpan span("bench prefill", "bench",
                     {{"measured", measured}, {"tokens", shape_.prompt_tokens}});
      logits = prefill_in_passes(model_, st, prompt_, chunk_);
      prefill_s = sw.elapsed();
    }
    int32_t next = argmax(logits.data(), V);
    if (measured) {
      add_gpu(gpu_, g0, out_.gpu_prefill);
      out_.ttft.push_back(sw.elapsed());  // the first token is known here
      PrefillTotals& t = out_.pre;
      t.expert_read += (model_.experts().stats() - pre0.experts).bytes_read;
      t.trunk_read += model_.trunk_stats().bytes_streamed - pre0.trunk.bytes_streamed;
      t.storage_read += process_storage_read_bytes() - pre0.storage;
      t.passes += model_.pass_stats().passes - pre0.passes.passes;
      t.tokens += shape_.prompt_tokens;
      t.seconds += prefill_s;
    }
    if (gpu_ != nullptr) g0 = gpu_->stats();
    const PhaseStart dec0(model_);
    TraceSpan decode_span("bench decode", "bench", {{"measured", measured}, {"tokens", gen}});
    sw.reset();
    if (drafter_) {
      // Greedy generation driven with drafting: the first decode pass is the plain pass over
      // the prompt's token, the others verify drafts.
      GenerationParams gp;
      gp.max_new_tokens = gen;
      Generation g({next}, gp, nullptr, V, st.position());
      draft_.stats = DraftStats{};
      drive(model_, st, g, nullptr, nullptr, &draft_, {prompt_, {}});
      if (measured) out_.drafted += draft_.stats;
    } else {
      for (int i = 0; i < gen; ++i) {
        auto l = model_.forward(st, std::span<const int32_t>(&next, 1));
        next = argmax(l.data(), V);
      }
    }
    decode_s = sw.elapsed();
    if (!measured) return;
    add_gpu(gpu_, g0, out_.gpu_decode);
    DecodeTotals& t = out_.dec;
    t.experts += model_.experts().stats() - dec0.experts;
    const TrunkStats trunk = model_.trunk_stats();
    t.trunk_streamed += trunk.bytes_streamed - dec0.trunk.bytes_streamed;
    t.trunk_wait += trunk.wait_s - dec0.trunk.wait_s;
    t.storage_read += process_storage_read_bytes() - dec0.storage;
    t.tokens += gen;
    t.seconds += decode_s;
    t.expert_fetches += model_.pass_stats().expert_fetches - dec0.passes.expert_fetches;
    t.passes += model_.pass_stats().passes - dec0.passes.passes;
  }

  // Out of core (the store read experts while decoding), when the cache holds one decode pass's
  // experts of every layer (not with drafting, whose verify passes ask for more).
  bool in_ram_reference_applies() const {
    const auto& plan = model_.plan();
    const uint64_t cache_slots =
        plan ? plan->expert_cache_bytes / std::max<uint64_t>(1, plan->expert_slot_bytes) : 0;
    const ModelConfig& c = model_.config();
    return shape_.in_ram_reference && !drafter_ && out_.dec.experts.misses > 0 &&
           cache_slots >= static_cast<uint64_t>(c.moe.top_k * c.num_moe_layers());
  }

  void in_ram_reference() {
    auto* store = dynamic_cast<ExpertStore*>(&model_.experts());
    if (store != nullptr) store->count_heat(false);
    std::unique_ptr<ExpertProvider> real =
        model_.replace_experts(std::make_unique<InRamReference>(model_.experts()));
    double p = 0, d = 0;
    one_run(std::min(shape_.gen_tokens, 2), p, d, false);  // reads the reference experts once
    const ExpertStats before = model_.experts().stats();
    for (int r = 0; r < shape_.reps; ++r) {
      one_run(shape_.gen_tokens, p, d, false);
      out_.in_ram_tps.push_back(shape_.gen_tokens / d);
    }
    const ExpertStats ref = model_.experts().stats() - before;
    out_.in_ram_hit_rate =
        ref.requests > 0 ? static_cast<double>(ref.hits) / static_cast<double>(ref.requests) : 0.0;
    model_.replace_experts(std::move(real));
    if (store != nullptr) store->count_heat(true);
  }

  LoadedModel& model_;
  BenchShape shape_;
  std::vector<int32_t> prompt_;
  SyntheticIds ids_;
  size_t chunk_;
  const gpu::Backend* gpu_;
  std::unique_ptr<Drafter> drafter_;
  DraftConfig draft_;
  BenchRuns out_;
};

}  // namespace

BenchRuns run_bench_passes(LoadedEngine& engine, const BenchShape& shape) {
  return Runner(engine, shape).run();
}

}  // namespace deltafin::cli
