// The quantised weights of the DeepSeek-V3 architecture as Kimi K2 and DeepSeek-V3 release them,
// as Matrix views the kernels take (docs/FAMILY.md, "FP8 E4M3 weights" and "INT4 pack-quantized
// weights"):
//   FP8  — `X.weight` F8_E4M3 [R, C] with `X.weight_scale_inv` F32 [ceil(R/128), ceil(C/128)]
//          (K2-Instruct-0905, DeepSeek-V3: every linear): WeightFormat::kFP8;
//   INT4 — `X.weight_packed` I32 [R, ceil(C/8)], `X.weight_scale` BF16 [R, ceil(C/32)] and
//          `X.weight_shape` I64 (or I32) [2] = [R, C] (K2-Thinking, K2.5: routed experts):
//          WeightFormat::kInt4.
// The checks are here, once, so a loader only names the tensors: every dtype, shape and size is
// checked against the others and against the format the kernels take (128 x 128 blocks, groups
// of 32), and a mismatch is an Error naming the tensor, what it holds and what was expected. The
// views point at TensorInfo::data (null when the tensor is not mapped: the caller then points
// `data` / `scales` at its own copy of the same bytes). Values are checked separately
// (check_quantized_values), because that reads every byte.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "tensor/matrix.h"
#include "tensor/tensor_info.h"

namespace deltafin {

// The FP8 view of `weight` (F8_E4M3, 2-D) with its `scale_inv` (F32 [ceil(R/b0), ceil(C/b1)]);
// `block` is the config's quantization_config.weight_block_size, which must be [128, 128].
Matrix fp8_block_matrix(const TensorInfo& weight, const TensorInfo& scale_inv,
                        std::array<int64_t, 2> block = {kFp8Block, kFp8Block});

// [R, C] from a `weight_shape` tensor (I64 or I32, shape [2], mapped): both positive and below
// 2^31.
std::array<int64_t, 2> int4_weight_shape(const TensorInfo& shape);

// The INT4 view of `packed` (I32 [R, ceil(C/8)]) with its `scale` (BF16 [R, ceil(C/group)]) for
// the logical shape [R, C] (int4_weight_shape); `group` is the config's group_size, which must be
// 32 (symmetric: no zero point).
Matrix int4_packed_matrix(const TensorInfo& packed, const TensorInfo& scale,
                          std::array<int64_t, 2> shape, int64_t group = kInt4Group);

// Rejects what would poison every product through `w` (FP8 or INT4; other formats pass): an
// FP8 NaN code (0x7F, 0xFF), a NaN or infinite scale. The Error names `name`, the row and column
// (or scale position) and the byte found. Reads every byte of the matrix once.
void check_quantized_values(const Matrix& w, const std::string& name);

}  // namespace deltafin
