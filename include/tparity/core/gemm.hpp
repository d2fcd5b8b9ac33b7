// General matrix multiply for the handwritten core, BLIS style (flame/blis, flame/blislab): packing,
// a macro-kernel and a register-tile micro-kernel, with explicit SIMD chosen at run time among
// AVX-512, AVX2 and scalar. No BLAS, no torch. Every sum accumulates in T.
//
// Arguments follow BLAS ?gemm in row-major order (cblas_sgemm(CblasRowMajor, ...) translates one to
// one); every matrix is row-major with a leading dimension, its row stride in elements.
#pragma once

#include <cstdint>
#include <string>

namespace tparity {

// What to do to each finished tile of C while it is still in cache, in this order:
//   C[i, j] = activation(alpha * (op(A) op(B))[i, j] + beta * C[i, j] + bias[j]) + residual[i, j]
// where the activation is ReLU (relu) or the function given (activation), or none.
// Each field is optional (null: skipped). The result is the same, bit for bit, as gemm() followed by
// the unfused passes (bias add, activation over each row, add_forward of the residual). The bias is
// added after the product, as linear_forward adds it; torch's addmm instead starts from the bias
// (C filled with it, beta = 1), a different rounding: to get that, fill C and pass beta = 1.
// The activation must not call gemm() (the call's buffers and threads are in use).
template <class T>
struct GemmEpilogue {
  const T* bias = nullptr;  // (N): added to every row (torch.nn.functional.linear's bias)
  // Elementwise, applied in place to row segments of C: out and inp are the same pointer, n the
  // segment's length. relu_forward<T> and gelu_forward<T> of ops.hpp fit as they are.
  void (*activation)(T* out, const T* inp, int64_t n) = nullptr;
  // ReLU as relu_forward<T> computes it (x <= 0 ? 0 : x: NaN stays NaN, -0 becomes +0), in the
  // activation's place (set one or neither): on whole tiles applied in registers as the micro-kernel
  // stores them, with the bias and the residual, where a function pointer costs a pass and a call per
  // row segment; elsewhere (edge tiles, the operand swap) on the stored rows, the same bits.
  bool relu = false;
  const T* residual = nullptr;  // (M, N) with row stride ldr, added last (the residual connection);
                                // it must not overlap C
  int64_t ldr = 0;
};

// mirrors torch.addmm(beta * C, op(A), op(B), alpha=alpha) / BLAS ?gemm, row-major.
// op(A) is (M, K): A is (M, K) with row stride lda, or (K, M) when trans_a
// op(B) is (K, N): B is (K, N) with row stride ldb, or (N, K) when trans_b (torch.nn.Linear's weight)
// C is (M, N) with row stride ldc; C = alpha * op(A) op(B) + beta * C, then the epilogue if given.
// beta == 0 overwrites C without reading it (NaN in C does not survive); alpha == 0 or K == 0 reads
// neither A nor B. The sum over K runs in kc-deep slices (GemmBlocking::kc), k ascending in each,
// each slice's sum added to C as alpha * slice + C, one fused multiply-add where the path has FMA.
// threads: how many threads split the rows of C (they share the packed B). 1, the default, runs on
// the caller's thread alone. More use threads - 1 workers kept from call to call: they yield for
// about 0.1 ms after a call, then block, so an idle worker takes no CPU from LibTorch's pool. Calls
// with threads > 1 from different threads take turns. Shapes are checked with asserts only: the
// callers are the core's ops, which know their shapes.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc, const GemmEpilogue<T>* epilogue = nullptr, int threads = 1);

// batch independent gemm() calls: matrix b of A starts at A + b * stride_a, likewise B and C (and
// the epilogue's residual, at residual + b * stride_r; its bias is shared). For attention's q k^T and
// weights v over (batch * heads). threads split the batch.
template <class T>
void gemm_strided_batched(int64_t batch, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha,
                          const T* A, int64_t lda, int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, T beta,
                          T* C, int64_t ldc, int64_t stride_c, const GemmEpilogue<T>* epilogue = nullptr,
                          int64_t stride_r = 0, int threads = 1);

// --- the instruction set ------------------------------------------------------------------------
// The micro-kernel in use: the best the CPU has (AVX-512 F, else AVX2 with FMA, else scalar), unless
// the environment variable TPARITY_ISA (scalar, avx2 or avx512) or gemm_force_isa() says otherwise.
enum class GemmIsa { Scalar, Avx2, Avx512 };

const char* to_string(GemmIsa isa);  // "scalar", "avx2", "avx512"
// "scalar", "avx2" or "avx512"; throws std::invalid_argument naming the string otherwise.
GemmIsa parse_gemm_isa(const std::string& name);

// Whether this CPU (and this build: the kernels exist only for x86-64) can run the path.
bool gemm_isa_available(GemmIsa isa);

// The data caches of the CPU the process runs on, as the OS reports them (bytes; 0: unknown), read
// once. The GEMM fits its mc and nc blocks to them (gemm_detail::kernel_info shows the result).
struct CpuCaches {
  int64_t l1d = 0, l2 = 0, l3 = 0;
  int l2_sharing = 1, l3_sharing = 1;  // CPUs sharing one L2, one L3
  int64_t l2_per_core() const { return l2 / (l2_sharing > 1 ? l2_sharing : 1); }  // 0: unknown
  std::string source;                  // "sysfs", or why they are unknown
};
const CpuCaches& cpu_caches();

// The path gemm() takes now. TPARITY_ISA is read at the first call (and after gemm_reset_isa()); if
// it names an unknown or unavailable path, this and every gemm() call throw std::invalid_argument
// saying so (a configuration error, not a silent fallback).
GemmIsa gemm_isa();

// Forces a path for the whole process (tests, benchmarks); throws std::invalid_argument, naming the
// path and the CPU feature it lacks, if the path is not available. gemm_reset_isa() drops the forced
// path and reads TPARITY_ISA again at the next call.
void gemm_force_isa(GemmIsa isa);
void gemm_reset_isa();

// --- for tests and tuning: the kernels behind each path -----------------------------------------
namespace gemm_detail {

// Block sizes of one path (BLISlab's names):
//   mr x nr  the register tile of C the micro-kernel holds (nr runs along C's rows, in SIMD lanes);
//   kc       the depth of a packed slice;
//   mc       rows of op(A) packed at a time (mc x kc, kept in L2);
//   nc       columns of op(B) packed at a time (kc x nc, kept in L3).
struct GemmBlocking {
  int mr, nr, kc, mc, nc;
};

// The micro-kernel contract, written once:
//   C(mr x n) = alpha * A(mr x kc) * B(kc x n) + beta * C,   nr - lanes < n <= nr
// (n = nr: the full tile; lanes, the path's vector width, KernelInfo::lanes).
// A's entry (r, k) at A[r * rs_a + k * cs_a]: packed by columns (rs_a = 1, cs_a = mr) or a row-major
// op(A) read where it lies (rs_a = lda, cs_a = 1). B packed by rows, nr wide (B[k * nr + j]; columns
// from n on are read but not used). C row-major with row stride ldc, any alignment; only its first
// n columns are read or written. beta == 0 writes C without reading it. The sum over k runs k
// ascending in T and is added to beta * C with one fused multiply-add where the path has FMA.
template <class T>
using MicroKernel = void (*)(int64_t kc, const T* A, int64_t rs_a, int64_t cs_a, const T* B, T* C, int64_t ldc, int n,
                             T alpha, T beta);

template <class T>
struct KernelInfo {
  GemmBlocking blocking;
  int lanes;  // elements of T per vector register: 16 for float on AVX-512, 1 on the scalar path
  MicroKernel<T> kernel;
};

// The path's kernel and block sizes; throws std::invalid_argument if the path is not available.
template <class T>
KernelInfo<T> kernel_info(GemmIsa isa);

// Whether gemm() may swap its operands for a few rows against a large transposed B (gemm.cpp,
// swap_pays): on by default; off for the tests that check it changes no bit.
void set_operand_swap(bool on);
// Whether gemm() on more than one thread deals the rows of C out as the threads come for them (on
// by default) or gives each thread a fixed share (off: for the tests that check it changes no bit,
// and for timing one against the other).
void set_row_dealing(bool on);

// The three-loop reference micro-kernel: the same contract for any mr, nr, in plain loops.
template <class T>
void reference_microkernel(int mr, int nr, int64_t kc, const T* A, int64_t rs_a, int64_t cs_a, const T* B, T* C,
                           int64_t ldc, int n, T alpha, T beta);

}  // namespace gemm_detail
}  // namespace tparity
