// Compute kernels behind one table, chosen once at start-up from the CPU's features (or forced
// with DELTAFIN_KERNELS=scalar|avx2|avx512|neon). The scalar table is the reference that every
// SIMD implementation is tested against on odd sizes. Kernels know nothing about models.
//
// Matrix products use the HF layout: W[n, k] with n = output, k = input; activations are fp32.
// MXFP4, BF16, FP8 (block-scaled E4M3) and INT4 (pack-quantized) weights are decoded inside the
// kernel, exactly, to fp32 (a small panel at a time at most, never a whole float copy of a
// matrix).
//
// Reproducibility: for a given table, every output element of matmul / matmul_t is computed by
// the same float32 operations in the same order whatever the thread count, the n0/n1 (c0/c1)
// split, the batch size M and the other rows of x (simd_impl.h states the order). So a row gets
// bit-identical results alone or batched with others (drafted tokens, other requests). Tables
// differ from each other (and from scalar) in the last bits.
#pragma once

#include <cstdint>

#include "tensor/matrix.h"

namespace deltafin {
class ThreadPool;
}

namespace deltafin::kernels {

// y[m*ldy + n] = (accumulate ? y : 0) + sum_k x[m*ldx + k] * W(n, k)
// for m in [0, M) and output rows n in [n0, n1). Single-threaded; callers split n.
using MatmulFn = void (*)(const Matrix& w, int64_t n0, int64_t n1, const float* x, int64_t M,
                          int64_t ldx, float* y, int64_t ldy, bool accumulate);

// y[m*ldy + c] += sum_r x[m*ldx + r] * W(r, c) for m in [0, M), columns c in [c0, c1):
// the product with W transposed (W's rows are the input). Single-threaded; callers split c.
using MatmulTFn = void (*)(const Matrix& w, int64_t c0, int64_t c1, const float* x, int64_t M,
                           int64_t ldx, float* y, int64_t ldy);

using DotFn = float (*)(const float* a, const float* b, int64_t n);
// y[i] += a * x[i]
using AxpyFn = void (*)(float a, const float* x, float* y, int64_t n);

// y[i] = f(x[i]) for i in [0, n), element-wise (y may alias x): a value's result depends on
// nothing but the value — not n, its position or the thread — so a row gets the same bits alone,
// batched or split. The x86 tables use SLEEF's deterministic 1-ULP functions ("finz": the same
// bits on every FMA ISA, so AVX2 and AVX-512 agree exactly); scalar and NEON use libm.
using UnaryFn = void (*)(const float* x, float* y, int64_t n);

// `iters` rounds of independent FMAs (fma_loop_flops floating-point operations per round) with
// no memory traffic: the FMA peak that GEMM efficiency is measured against.
using FmaLoopFn = float (*)(int64_t iters);

struct KernelTable {
  const char* name;
  MatmulFn matmul[kWeightFormats];     // indexed by WeightFormat
  MatmulTFn matmul_t[kWeightFormats];  // indexed by WeightFormat (nullptr where unsupported)
  DotFn dot;
  AxpyFn axpy;
  UnaryFn exp;   // e^x, within 1 ULP
  UnaryFn tanh;  // tanh(x), within 1 ULP
  FmaLoopFn fma_loop;
  int fma_loop_flops;
};

const KernelTable& scalar_table();
// nullptr when the ISA is not compiled in or not supported by this CPU.
const KernelTable* avx2_table();
const KernelTable* avx512_table();
const KernelTable* neon_table();

// The per-ISA tables themselves (x86/avx2.cpp, x86/avx512.cpp, arm/neon.cpp). They are compiled
// with that ISA's flags, so not one instruction of theirs may run before the CPU check: use the
// checked accessors above (dispatch.cpp), never these directly.
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();
const KernelTable& neon_kernels();

// The table in use (picked on first call).
const KernelTable& active();
// Forces a table by name ("scalar", "avx2", ...); throws Error if unavailable here.
void select(const char* name);

// The active table's single-threaded kernels for a weight format, for callers that already
// split their work over the pool (per-head products). Where the table has no transposed kernel
// for a format, the scalar one is used: the choice is made here, never in model code.
MatmulFn matmul_fn(WeightFormat f);
MatmulTFn matmul_t_fn(WeightFormat f);

// The active table's FMA peak in FLOP/s over every thread of `pool` (each runs fma_loop for about
// `seconds`; the best of three tries). What `bench` states prefill compute against.
double fma_peak_flops(ThreadPool& pool, double seconds = 0.05);

// Threaded front ends over the active table: split the output across the pool in chunks that
// keep each thread's share of W contiguous.
void matmul(const Matrix& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy,
            ThreadPool& pool, bool accumulate = false);
void matmul_t(const Matrix& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy,
              ThreadPool& pool);

}  // namespace deltafin::kernels
