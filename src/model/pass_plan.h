// The prefill arrangement: how a prompt is cut into forward passes and how one pass
// walks its rows, as one plain description that any backend (this CPU model, the Vulkan one)
// executes the same way. It lives here, beside the model, because it is a statement about the
// K3 loop; the memory planner (storage/plan) only chooses its two numbers from the budget.
//
// A prompt of N tokens runs in ceil(N / pass_rows) passes. One pass goes layer by layer over
// all its rows (layer-major), so every routed expert a layer needs is requested once per pass
// for all the rows that chose it, however many rows that is. What must live for the whole pass
// is small per row (the Attention-Residuals anchors and partial sum, the MoE's latent inputs,
// routing and per-slot outputs: `held` bytes); everything else (attention projections, the
// dense MLP, expert batches, router logits: `scratch` bytes) is computed block_rows rows at a
// time inside each layer. So the pass can be as long as the budget holds `held` bytes per row,
// and the number of passes — and with it the expert bytes read per prompt token — is as small
// as memory allows. The block split changes no result: every per-row operation is independent
// of how many rows run beside it (kernels.h), KDA takes the chunked form by the sequence's
// rows in the pass and block_rows is a multiple of its 16-row chunk, and experts see their rows
// in the same order.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"

namespace deltafin {

struct PassPlan {
  // Prompt rows per forward pass (the prefill chunk): `held` bytes live for each of them.
  int64_t pass_rows = 256;
  // Rows whose scratch is live at once inside a layer; a multiple of 16 (the KDA chunk).
  int64_t block_rows = 256;
  // Whether pass_rows was chosen from the budget ("auto") or given (--prefill-chunk N).
  bool automatic = false;

  std::string describe() const;
};

// Blocks are whole KDA chunks so a sequence split over blocks runs the same chunked recurrence.
constexpr int64_t kPassBlockQuantum = 16;
// The block size an automatic plan aims for: enough rows per projection GEMM to run near peak.
constexpr int64_t kDefaultBlockRows = 256;

// Blocks for a pass of `pass_rows`: kDefaultBlockRows, or the pass in whole KDA chunks if shorter.
int64_t pass_block_rows(int64_t pass_rows);

// fp32 bytes per row of a pass: what lives for the whole pass, and what one block needs.
struct PassRowBytes {
  uint64_t held = 0;
  uint64_t scratch = 0;
};
PassRowBytes pass_row_bytes(const ModelConfig& c);

// Activation bytes of a pass of `pass_rows` rows in blocks of `block_rows` (without logits).
uint64_t pass_bytes(const ModelConfig& c, int64_t pass_rows, int64_t block_rows);

}  // namespace deltafin
