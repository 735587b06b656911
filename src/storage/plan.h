// The memory planner: divides a RAM budget among fixed costs (sequence states, activation
// buffers, tokenizer and process overhead, the routers kept for prefetch), trunk units kept
// resident, the buffers that stream the rest, and the expert cache. Resident trunk
// comes before expert cache: a resident trunk byte saves one read per pass, a cached expert
// byte far less (K3's routing is flat), so the planner keeps as much trunk as fits next to the
// smallest workable expert cache and gives the remainder to experts. A budget below the
// minimum working set is refused with the minimum stated.
//
// Streamed units go through stream_buffers buffers of the largest streamed unit: one computing,
// the others read ahead (the next units in pass order, wrapping into the next pass). Two is the
// minimum; more are planned only from room the expert cache holds beyond two passes' experts
// (a read-ahead buffer saves no byte, a resident unit or cached expert does), or as many as
// --trunk-read-ahead asks for, which then may cost resident units.
//
// Prefill passes (model/pass_plan.h) come out of the budget too: with an automatic chunk the
// planner gives a pass as many rows as up to half of what is left after the minimum working set
// holds (the other half stays for resident trunk and expert cache, which decode lives on), up
// to the rows a prompt needs, so a prompt is read in as few passes as memory allows — each pass
// reads every expert it needs once, whatever its length.
//
// K3's vision tower (a checkpoint holding vision_tower.* / mm_projector.* tensors) is a fixed cost:
// kept resident, never streamed. Each image runs all 27 layers once, so streaming the tower like a
// trunk unit would read its 0.8 GB per image to save under a thousandth of K3's weights; the plan
// takes its bound weights and the working memory of the largest image the processor can make
// (PlanShape::vision_max_patches) before trunk and experts, like a draft model's weights.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/inventory.h"
#include "model/pass_plan.h"

namespace deltafin {

class Checkpoint;

enum class TrunkFormat { kBF16, kInt8 };
// "bf16" or "int8", as --trunk spells it.
const char* trunk_format_name(TrunkFormat f);

// What the runtime adds to the user's settings before memory is planned: how the model will be
// run (sequences held at once, rows per pass) and what loads beside it (a draft model, the RAM of
// kept prefix snapshots). runtime/load.h fills it from the load request.
struct PlanShape {
  int sequences = 1;  // states kept at once (server: parallel + cached conversations)
  // Rows per forward pass (prefill chunk / batch); 0 = auto: as many as the budget holds, up to
  // `prefill_rows` (0 = the context), so a prompt runs in as few passes as memory allows.
  int64_t max_rows = 256;
  int64_t prefill_rows = 0;
  // A draft model next to the target (src/draft): its weights, and its cache per position of
  // each sequence. Both are fixed costs taken from the budget before trunk and experts.
  uint64_t draft_weight_bytes = 0;
  uint64_t draft_cache_bytes_per_position = 0;
  // RAM for kept prefix snapshots (prefix/prefix_store.h; default_state_cache_bytes when the
  // user left it to us). A fixed cost like the states.
  uint64_t state_cache_bytes = 0;
  // The most patches one image can have under the checkpoint's media_proc_cfg
  // (vision::max_patches; 0: the release's kReleaseVisionMaxPatches). Used only when the
  // checkpoint has a vision tower.
  int64_t vision_max_patches = 0;
  int vision_threads = 1;  // compute threads (each holds one attention task's scores)
};

// vision::max_patches of the released media_proc_cfg (tests check the two agree).
inline constexpr int64_t kReleaseVisionMaxPatches = 67854;

struct PlanOptions {
  uint64_t budget = 0;   // 0 = default_memory_budget()
  int64_t context = 0;   // positions per sequence the MLA cache must hold (0: plan_context's)
  bool prefetch = true;  // keep every MoE layer's router resident for prediction
  TrunkFormat trunk = TrunkFormat::kBF16;
  uint64_t expert_slot_bytes = 0;  // RAM per cached expert as the store lays it out (0 = estimate)
  // Streamed trunk units read ahead of the one computing (--trunk-read-ahead): 0 = as the budget
  // allows beside the expert cache, never at the cost of a resident unit (at least 1); N > 0 =
  // N, paid for by resident trunk or expert cache where the budget has no spare room (fewer
  // where even that cannot hold them; the plan line says what it got).
  int trunk_read_ahead = 0;
  PlanShape shape;
};

struct MemoryPlan {
  uint64_t budget = 0;
  int64_t context = 0;
  int sequences = 0;
  uint64_t state_bytes = 0;     // all sequences
  uint64_t buffer_bytes = 0;    // activations of one pass (pass.pass_rows rows) and its logits
  PassPlan pass;                // rows per prompt pass and per block
  PassRowBytes pass_row;        // what a pass holds per row
  uint64_t overhead_bytes = 0;  // tokenizer, allocator slack
  uint64_t router_bytes = 0;    // prefetch roster
  uint64_t draft_weight_bytes = 0, draft_cache_bytes = 0;  // all sequences' draft caches
  uint64_t state_cache_bytes = 0;                          // kept prefix snapshots
  // The vision tower and projector (0 without one): parameters, weights as bound (resident), and
  // the working memory of one image of vision_max_patches patches (model/vision_tower.h).
  int64_t vision_params = 0;
  uint64_t vision_weight_bytes = 0, vision_work_bytes = 0;
  int64_t vision_max_patches = 0;
  uint64_t fixed_bytes() const {
    return state_bytes + buffer_bytes + overhead_bytes + router_bytes + draft_weight_bytes +
           draft_cache_bytes + state_cache_bytes + vision_weight_bytes + vision_work_bytes;
  }
  // Trunk units: 0..L-1 are the layers, L is the head (LM head + output norms).
  std::vector<uint64_t> unit_bytes;       // as stored in RAM (int8 when TrunkFormat::kInt8)
  std::vector<uint64_t> unit_file_bytes;  // as read from the checkpoint
  std::vector<bool> resident;
  uint64_t trunk_resident_bytes = 0;
  uint64_t stream_buffer_bytes = 0;  // stream_buffers buffers of the largest streamed unit
  int stream_buffers = 0;            // one computing + the read-ahead (0: nothing streams)
  uint64_t expert_cache_bytes = 0;
  uint64_t expert_slot_bytes = 0;
  uint64_t all_experts_bytes = 0;
  uint64_t min_working_set = 0;
  TrunkFormat trunk = TrunkFormat::kBF16;
  bool prefetch = true;

  uint64_t streamed_bytes_per_pass() const;
  std::string describe() const;
};

// Bytes as the plan lines print them ("12.5 KiB", "3.4 MiB", "1.25 GiB").
std::string gib(uint64_t bytes);

// 75% of the physical memory or of the cgroup limit, whichever is smaller.
uint64_t default_memory_budget();
// Memory this process uses outside the budget (code, libraries, allocator, page tables): what
// peak RSS may exceed the budget by.
constexpr uint64_t kFixedOverheadBytes = 96ull << 20;

MemoryPlan plan_memory(const ModelConfig& c, const Checkpoint& ck, const PlanOptions& o);
// The same plan from a tensor table alone (`deltafin doctor` plans the released K3 from its
// config, with no checkpoint on disk).
MemoryPlan plan_memory(const ModelConfig& c, const TensorTable& tensors, const PlanOptions& o);

// Bytes of one sequence's State holding `context` positions.
uint64_t state_bytes(const ModelConfig& c, int64_t context);
// The positions per sequence a plan holds: `requested` (capped at the model's), or when it is 0
// the model's limit up to 8,192.
int64_t plan_context(const ModelConfig& c, int64_t requested);
// The default RAM share of kept prefix snapshots: room for two full-context states.
uint64_t default_state_cache_bytes(const ModelConfig& c, int64_t context);

}  // namespace deltafin
