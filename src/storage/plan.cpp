#include "storage/plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/sysinfo.h"
#include "model/inventory.h"
#include "model/vision_config.h"
#include "model/vision_tower.h"
#include "model/weights.h"
#include "storage/checkpoint.h"
#include "storage/trunk_units.h"

namespace deltafin {

namespace {
constexpr uint64_t kAlign = 4096;
uint64_t align_up(uint64_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

// RAM a unit of tensors needs: file bytes (bf16) or int8 bytes for its BF16 matrices.
const TensorInfo& get(const TensorTable& tensors, const std::string& name) {
  auto it = tensors.find(name);
  if (it == tensors.end()) fail_arg("tensor {} is missing", name);
  return it->second;
}

uint64_t unit_ram(const TensorTable& ck, const std::vector<std::string>& names, TrunkFormat f,
                  bool& any_int8) {
  uint64_t n = 0;
  for (const auto& name : names) {
    const TensorInfo& t = get(ck, name);
    const bool matrix = t.shape.size() == 2 && t.dtype == DType::kBF16 && t.shape[0] > 1;
    if (f == TrunkFormat::kInt8 && matrix && !name.ends_with("model.embed_tokens.weight")) {
      n += int8_bytes(t.shape[0], t.shape[1]);
      any_int8 = true;
    } else {
      n += t.nbytes;
    }
  }
  return n;
}
}  // namespace

uint64_t default_memory_budget() {
  uint64_t avail = physical_memory_bytes();
  uint64_t cg = cgroup_memory_limit_bytes();
  if (cg > 0 && (avail == 0 || cg < avail)) avail = cg;
  return avail / 4 * 3;
}

uint64_t state_bytes(const ModelConfig& c, int64_t context) {
  const uint64_t kda = static_cast<uint64_t>(c.kda.num_heads * c.kda.head_dim * c.kda.head_dim +
                                             (c.kda.conv_kernel - 1) * 3 * c.kda.proj_dim()) *
                       4;
  const uint64_t mla = static_cast<uint64_t>(c.mla.cache_width() * context) * 4;
  return kda * static_cast<uint64_t>(c.num_kda_layers()) +
         mla * static_cast<uint64_t>(c.num_mla_layers());
}

const char* trunk_format_name(TrunkFormat f) {
  return f == TrunkFormat::kInt8 ? "int8" : "bf16";
}

int64_t plan_context(const ModelConfig& c, int64_t requested) {
  return requested > 0 ? std::min(requested, c.max_positions)
                       : std::min<int64_t>(c.max_positions, 8192);
}

uint64_t default_state_cache_bytes(const ModelConfig& c, int64_t context) {
  return 2 * state_bytes(c, context);
}

uint64_t MemoryPlan::streamed_bytes_per_pass() const {
  uint64_t n = 0;
  for (size_t i = 0; i < resident.size(); ++i) {
    if (!resident[i]) n += unit_file_bytes[i];
  }
  return n;
}

std::string MemoryPlan::describe() const {
  size_t n_res = 0;
  for (bool r : resident) n_res += r;
  std::string s = fmt::format(
      "[plan] memory budget {}: fixed {} (state {} for {} sequence(s) x {} positions, buffers {}, "
      "overhead {}{}{}{})\n",
      gib(budget), gib(fixed_bytes()), gib(state_bytes), sequences, context, gib(buffer_bytes),
      gib(overhead_bytes), router_bytes ? ", routers for prefetch " + gib(router_bytes) : "",
      draft_weight_bytes
          ? ", draft model " + gib(draft_weight_bytes) + " + its cache " + gib(draft_cache_bytes)
          : "",
      state_cache_bytes ? ", kept prefix snapshots " + gib(state_cache_bytes) : "");
  if (vision_params > 0) {
    s += fmt::format(
        "[plan] vision tower + projector: {:.1f} M parameters, resident {} (never streamed) + {} "
        "working memory for an image of up to {} patches (in the fixed costs)\n",
        static_cast<double>(vision_params) / 1e6, gib(vision_weight_bytes), gib(vision_work_bytes),
        vision_max_patches);
  }
  s += fmt::format(
      "[plan] trunk{}: {} of {} units resident ({}), {} streamed per pass through {} of buffers"
      "{}\n",
      trunk == TrunkFormat::kInt8 ? " (int8, lossy)" : "", n_res, resident.size(),
      gib(trunk_resident_bytes), gib(streamed_bytes_per_pass()), gib(stream_buffer_bytes),
      stream_buffers > 0
          ? fmt::format(" ({}: {} unit(s) read ahead)", stream_buffers, stream_buffers - 1)
          : std::string());
  s += fmt::format(
      "[plan] expert cache {} = {} experts of {} ({:.1f}% of all {}); minimum working set {}\n",
      gib(expert_cache_bytes), expert_slot_bytes ? expert_cache_bytes / expert_slot_bytes : 0,
      gib(expert_slot_bytes),
      all_experts_bytes
          ? 100.0 * static_cast<double>(expert_cache_bytes) / static_cast<double>(all_experts_bytes)
          : 0.0,
      gib(all_experts_bytes), gib(min_working_set));
  s += fmt::format("[plan] {} ({} held per row, {} scratch per block row)", pass.describe(),
                   gib(pass_row.held), gib(pass_row.scratch));
  return s;
}

std::string gib(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / 1073741824.0);
  if (b >= (1ull << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / 1048576.0);
  return fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024.0);
}

MemoryPlan plan_memory(const ModelConfig& c, const Checkpoint& ck, const PlanOptions& o) {
  return plan_memory(c, ck.tensors(), o);
}

MemoryPlan plan_memory(const ModelConfig& c, const TensorTable& ck, const PlanOptions& o) {
  MemoryPlan p;
  p.budget = o.budget > 0 ? o.budget : default_memory_budget();
  p.context = plan_context(c, o.context);
  const PlanShape& shape = o.shape;
  p.sequences = std::max(1, shape.sequences);
  p.trunk = o.trunk;
  p.prefetch = o.prefetch && c.num_moe_layers() > 1;
  p.state_bytes = state_bytes(c, p.context) * static_cast<uint64_t>(p.sequences);
  const uint64_t logits_bytes = static_cast<uint64_t>(p.sequences * c.vocab) * 4;
  const int64_t wanted = std::max<int64_t>(
      shape.max_rows > 0 ? shape.max_rows
                         : (shape.prefill_rows > 0 ? shape.prefill_rows : p.context),
      p.sequences);
  // The smallest pass the plan must hold (given rows, or one KDA chunk when automatic); an
  // automatic plan grows it below, once the rest of the working set is known.
  p.pass_row = pass_row_bytes(c);
  p.pass.automatic = shape.max_rows <= 0;
  p.pass.pass_rows = p.pass.automatic ? std::min(wanted, kPassBlockQuantum) : wanted;
  p.pass.block_rows = pass_block_rows(p.pass.pass_rows);
  p.buffer_bytes = pass_bytes(c, p.pass.pass_rows, p.pass.block_rows) + logits_bytes;
  p.overhead_bytes = 32ull << 20;
  p.draft_weight_bytes = shape.draft_weight_bytes;
  p.draft_cache_bytes = shape.draft_cache_bytes_per_position * static_cast<uint64_t>(p.context) *
                        static_cast<uint64_t>(p.sequences);
  p.state_cache_bytes = shape.state_cache_bytes;
  // The vision tower, when the checkpoint has one: resident (plan.h says why).
  if (std::any_of(ck.begin(), ck.end(), [](const auto& t) { return is_vision_tensor(t.first); })) {
    const VisionConfig v = vision_config_of(c);
    const VisionCost vc = vision_cost(v);
    p.vision_params = vc.tower_params + vc.projector_params;
    p.vision_weight_bytes = vc.weight_bytes;
    p.vision_max_patches =
        shape.vision_max_patches > 0 ? shape.vision_max_patches : kReleaseVisionMaxPatches;
    p.vision_work_bytes = vision_work_bytes(v, p.vision_max_patches, shape.vision_threads);
  }
  // Units.
  bool any_int8 = false;
  const int L = static_cast<int>(c.num_layers);
  for (int i = 0; i <= L; ++i) {
    auto names = i < L ? layer_trunk_tensors(c, i, ck) : head_tensors(c);
    uint64_t file = 0;
    for (const auto& n : names) file += get(ck, n).nbytes;
    p.unit_file_bytes.push_back(align_up(file + 2 * kAlign * names.size()));
    p.unit_bytes.push_back(unit_ram(ck, names, o.trunk, any_int8));
  }
  if (p.prefetch) {
    for (int i = static_cast<int>(c.first_k_dense); i < L; ++i) {
      for (const auto& n : router_tensors(c, i)) p.router_bytes += get(ck, n).nbytes;
    }
  }
  // Experts.
  if (c.num_moe_layers() > 0) {
    const std::string e0 = expert_prefix(c, c.first_k_dense, 0);
    uint64_t eb = 0;
    for (const auto& s : expert_tensor_suffixes(c, c.expert_format())) {
      if (auto it = ck.find(e0 + s); it != ck.end()) eb += it->second.nbytes;
    }
    p.expert_slot_bytes = o.expert_slot_bytes > 0 ? o.expert_slot_bytes : align_up(eb + 2 * kAlign);
    p.all_experts_bytes =
        p.expert_slot_bytes * static_cast<uint64_t>(c.moe.num_experts * c.num_moe_layers());
  }
  const uint64_t min_experts =
      p.expert_slot_bytes * static_cast<uint64_t>(c.num_moe_layers() > 0 ? c.moe.top_k : 0);
  const uint64_t largest = *std::max_element(p.unit_file_bytes.begin(), p.unit_file_bytes.end());
  p.min_working_set = p.fixed_bytes() + 2 * largest + min_experts;
  if (p.budget < p.min_working_set) {
    fail_setting("memory budget", gib(p.budget),
                 "below the minimum working set of {} for this model (fixed costs {}, two buffers "
                 "of its largest trunk layer {}, the {} experts of one pass {}); raise the memory "
                 "budget or lower the context / parallel sequences",
                 gib(p.min_working_set), gib(p.fixed_bytes()), gib(2 * largest), c.moe.top_k,
                 gib(min_experts));
  }
  // An automatic prefill pass: as many rows as half the room beyond the minimum working set
  // holds, up to what the prompt needs.
  if (p.pass.automatic && wanted > p.pass.pass_rows) {
    const PassRowBytes& rb = p.pass_row;
    const uint64_t room = (p.budget - p.min_working_set) / 2 + p.buffer_bytes - logits_bytes;
    const int64_t block = pass_block_rows(wanted);
    const uint64_t scratch = rb.scratch * static_cast<uint64_t>(block);
    if (room > scratch) {
      const auto fit = static_cast<int64_t>((room - scratch) / rb.held);
      if (fit > p.pass.pass_rows) {
        p.pass.pass_rows = std::min(wanted, fit);
        p.pass.block_rows = std::min(block, pass_block_rows(p.pass.pass_rows));
        p.buffer_bytes = pass_bytes(c, p.pass.pass_rows, p.pass.block_rows) + logits_bytes;
      }
    }
  }
  // Trunk residency: everything if it fits beside the minimum expert cache; else the largest
  // layer prefix-in-order that leaves room for the stream buffers.
  uint64_t all_trunk = 0;
  for (auto b : p.unit_bytes) all_trunk += b;
  p.resident.assign(p.unit_bytes.size(), false);
  const uint64_t avail = p.budget - p.fixed_bytes() - min_experts;
  if (all_trunk <= avail) {
    std::fill(p.resident.begin(), p.resident.end(), true);
    p.trunk_resident_bytes = all_trunk;
  } else {
    // The stream buffers are sized by the largest streamed unit, so keeping the largest
    // units resident can free more room than it takes. Try every "the k largest are resident"
    // start, fill the rest greedily by size, and keep the split with the most resident bytes.
    // An asked-for read-ahead that does not fit is tried one buffer shallower, down to two.
    const size_t n = p.unit_bytes.size();
    std::vector<size_t> by_size(n);
    for (size_t i = 0; i < n; ++i) by_size[i] = i;
    std::sort(by_size.begin(), by_size.end(),
              [&](size_t a, size_t b) { return p.unit_file_bytes[a] > p.unit_file_bytes[b]; });
    uint64_t best_used = 0, best_buffers = 0;
    std::vector<bool> best(n, false);
    int count = o.trunk_read_ahead > 0 ? o.trunk_read_ahead + 1 : 2;
    for (; count >= 2 && best_buffers == 0; --count) {
      for (size_t k = 0; k < n; ++k) {
        std::vector<bool> res(n, false);
        uint64_t used = 0;
        for (size_t j = 0; j < k; ++j) {
          res[by_size[j]] = true;
          used += p.unit_bytes[by_size[j]];
        }
        // The largest streamed unit is unit k.
        const uint64_t buffers = static_cast<uint64_t>(count) * p.unit_file_bytes[by_size[k]];
        if (used + buffers > avail) continue;
        for (size_t j = k + 1; j < n; ++j) {
          if (used + p.unit_bytes[by_size[j]] + buffers <= avail) {
            res[by_size[j]] = true;
            used += p.unit_bytes[by_size[j]];
          }
        }
        if (used > best_used || best_buffers == 0) {
          best_used = used;
          best_buffers = buffers;
          best = res;
          p.stream_buffers = count;
        }
      }
    }
    if (best_buffers == 0) fail("internal: no trunk split fits the minimum working set");
    p.resident = best;
    p.trunk_resident_bytes = best_used;
    const uint64_t unit = best_buffers / static_cast<uint64_t>(p.stream_buffers);
    // No more buffers than streamed units (one per unit holds the whole streamed trunk).
    const int streamed = static_cast<int>(std::count(best.begin(), best.end(), false));
    p.stream_buffers = std::min(p.stream_buffers, std::max(2, streamed));
    if (o.trunk_read_ahead <= 0) {
      // Automatic: deeper only from what the expert cache holds beyond two passes' experts.
      const uint64_t used = p.fixed_bytes() + best_used + 2 * unit + 2 * min_experts;
      const uint64_t spare = p.budget > used ? p.budget - used : 0;
      p.stream_buffers = std::min(streamed, 2 + static_cast<int>(spare / unit));
      p.stream_buffers = std::max(p.stream_buffers, 2);
    }
    p.stream_buffer_bytes = unit * static_cast<uint64_t>(p.stream_buffers);
  }
  const uint64_t rest = p.budget - p.fixed_bytes() - p.trunk_resident_bytes - p.stream_buffer_bytes;
  p.expert_cache_bytes = std::min(rest, p.all_experts_bytes);
  if (p.expert_slot_bytes > 0)
    p.expert_cache_bytes = p.expert_cache_bytes / p.expert_slot_bytes * p.expert_slot_bytes;
  (void)any_int8;
  return p;
}

}  // namespace deltafin
