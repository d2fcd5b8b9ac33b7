// Vectorised elementwise math for the handwritten core: exp and a row softmax built on it, with
// explicit SIMD chosen at run time among AVX-512, AVX2 and scalar. No torch, no libm in the float
// path. The path is the GEMM's: gemm_isa() (gemm.hpp), so TPARITY_ISA and gemm_force_isa() choose
// both (the core has one instruction-set switch).
#pragma once

#include <cstdint>

namespace tparity {

// mirrors torch.exp. out may alias in (the same pointer; no other overlap).
// float: Cody-Waite range reduction and a degree-7 polynomial (src/core/vmath_simd.hpp). Measured
// against expl over every float in [-104, 89] (2.24e9 inputs): at most 0.988 ulp on the AVX2 and
// AVX-512 paths (which agree bit for bit) and 0.952 ulp on the scalar path; outside that range the
// result is 0 or inf, as the exact value rounds. Subnormal results are rounded, not flushed.
// exp(-inf) = 0, exp(+inf) = inf, exp(NaN) = NaN; x < -103.98 gives 0, x > 88.73 gives inf.
// double: the C library's exp on every path (a vector double exp is not worth it here: the double
// instantiation is the semantic check, where libm's accuracy is the point).
template <class T>
void exp_forward(T* out, const T* in, int64_t n);

// mirrors torch.softmax(x, dim=-1), with the semantics of softmax_forward (ops.hpp): per row of
// length cols, m = the row's maximum (NaN entries skipped), y = exp(x - m) (exp_forward's exp), then
// y / sum(y), a division, not a multiplication by the reciprocal. A row whose entries are all -inf
// gives NaN, as torch does (exp(-inf - -inf) = exp(NaN)); a NaN entry makes its row NaN; an entry of
// -inf in a row with a finite maximum gives exactly 0. The sum runs in T in the path's lanes (16, 8
// or 1 partial sums, then combined), not in softmax_forward's eight: the same error bound,
// gamma_cols, not the same bits.
// in is (rows, cols); out will be (rows, cols); out may alias in.
// threads: whole rows split over up to `threads` threads (parallel.hpp); the result does not depend
// on it.
template <class T>
void softmax_rows(T* out, const T* in, int64_t rows, int64_t cols, int threads = 1);

// mirrors torch.nn.functional.layer_norm over the last axis, with the semantics and the exact sums of
// layernorm_forward_ref (ops.hpp): a first mean, its correction from the deviations, the biased
// variance of the corrected deviations, rstd = 1 / sqrt(var + eps), each sum in eight partial sums
// over the elements c % 8 in ascending order, combined pairwise; then ((x - mean0) - mu) * rstd
// times weight plus bias. Bit for bit the reference's on every path: the path's lanes hold rows (a
// block of `width` rows transposed), not elements of a row, so the sums stay the same.
// in is (rows, cols); weight and bias are (cols) or null; out will be (rows, cols) and may alias in
// (the same pointer); mean_out and rstd_out are (rows) or null.
// threads: blocks of rows over up to `threads` threads (parallel.hpp).
template <class T>
void layernorm_rows(T* out, const T* in, const T* weight, const T* bias, T eps, int64_t rows, int64_t cols, T* mean_out,
                    T* rstd_out, int threads = 1);

}  // namespace tparity
