// The inner loop of absorbed-form MLA attention, shared by the target's MLA (mla.cpp) and the
// draft models' (src/draft): one query row scored against n latent cache rows, softmax, and
// the weighted sum of the rows' latent part. One copy, so the target and its drafts compute
// attention with the same operations in the same order.
#pragma once

#include <cstdint>

namespace deltafin {

// q [cw] against cache rows [n][cw] (scores = q·row · scale), softmax over the n scores, then
// obar [dc] = Σ softmax_j · row_j[0 .. dc) (overwritten). `scores` is scratch of n floats.
void latent_attention(const float* q, const float* cache, int64_t n, int64_t cw, int64_t dc,
                      float scale, float* scores, float* obar);

}  // namespace deltafin
