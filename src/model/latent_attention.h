// The inner loop of absorbed-form MLA attention, shared by the target's MLA (mla.cpp) and the
// draft models' (src/draft): query rows scored against latent cache rows, softmax, and the
// weighted sum of the rows' latent part. One copy, so the target and its drafts compute
// attention with the same operations in the same order.
#pragma once

#include <cstdint>

namespace deltafin {

// Query rows q [count][cw], row t at position base + t, each against the cache rows it sees,
// [0, base + t] of cache [..][cw] (scores = q·row · scale), softmax over those scores, then
// obar [count][dc] = Σ softmax_j · row_j[0 .. dc) (overwritten). The scores are the f32
// matmul's and the weighted sum the f32 matmul_t's, whose results do not depend on how many
// rows go through together: a row gets the same bits in a prefill batch as alone in decode.
void latent_attention_rows(const float* q, int64_t count, int64_t base, const float* cache,
                           int64_t cw, int64_t dc, float scale, float* obar);

// One query row against cache rows [0, n): latent_attention_rows for a single row.
void latent_attention(const float* q, const float* cache, int64_t n, int64_t cw, int64_t dc,
                      float scale, float* obar);

}  // namespace deltafin
