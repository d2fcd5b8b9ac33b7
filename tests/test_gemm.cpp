// The GEMM (tparity/core/gemm.hpp) on every instruction-set path this machine has, each forced in
// turn: its micro-kernels against the three-loop reference micro-kernel, whole calls against a
// long-double scalar twin on the edge sizes of the path's own blocking, the fused epilogue against
// the unfused passes, the batched call against a loop, and the switch between paths.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "tparity/core/gemm.hpp"
#include "tparity/core/gemv.hpp"
#include "tparity/core/llm.hpp"
#include "tparity/core/ops.hpp"
#include "tparity/harness/rng.hpp"

using namespace tparity;
using Catch::Matchers::Contains;
using gemm_detail::GemmBlocking;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<GemmIsa> available_isas() {
  std::vector<GemmIsa> v;
  for (GemmIsa isa : {GemmIsa::Scalar, GemmIsa::Avx2, GemmIsa::Avx512})
    if (gemm_isa_available(isa)) v.push_back(isa);
  return v;
}

// Forces a path for one scope.
struct ForceIsa {
  explicit ForceIsa(GemmIsa isa) { gemm_force_isa(isa); }
  ~ForceIsa() { gemm_reset_isa(); }
  ForceIsa(const ForceIsa&) = delete;
  ForceIsa& operator=(const ForceIsa&) = delete;
};

// Turns one of gemm_detail's switches back on (its default) when the scope ends.
struct SwitchBackOn {
  void (*set)(bool);
  ~SwitchBackOn() { set(true); }
};

// A rows x cols matrix, row-major with row stride ld = cols + pad, starting off elements into its
// buffer (off = 1 puts every row off the vector alignment). The padding holds NaN: a gemm that reads
// it poisons C, one that writes it is caught by pads_untouched().
template <class T>
struct Mat {
  int64_t rows, cols, ld, off;
  std::vector<T> buf;
  Mat(int64_t r, int64_t c, int64_t pad, int64_t o)
      : rows(r), cols(c), ld(c + pad > 0 ? c + pad : 1), off(o), buf(size_t(o + r * ld + 1), T(kNaN)) {}
  T* data() { return buf.data() + off; }
  T& operator()(int64_t i, int64_t j) { return buf[size_t(off + i * ld + j)]; }
  T operator()(int64_t i, int64_t j) const { return buf[size_t(off + i * ld + j)]; }
  bool pads_untouched() const {
    for (size_t e = 0; e < buf.size(); ++e) {
      const int64_t rel = int64_t(e) - off;
      const bool inside = rel >= 0 && rel / ld < rows && rel % ld < cols;
      if (!inside && !std::isnan(buf[e])) return false;
    }
    return true;
  }
};

// Fills the matrix (not its padding): N(0, 1), or integers in [-4, 4] (every sum below stays exact).
template <class T>
void fill(Mat<T>& m, Rng& rng, bool integers) {
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) m(i, j) = integers ? T(rng.integer(-4, 4)) : T(rng.normal());
}

// gamma_n = n u / (1 - n u): Higham's bound factor for n roundings of unit roundoff u.
long double gamma_n(int64_t n, long double u) { return n * u / (1 - n * u); }

template <class T>
constexpr long double unit_roundoff() {
  return std::numeric_limits<T>::epsilon() / 2;  // 2^-24 for float, 2^-53 for double
}

struct Case {
  int64_t M, N, K;
  bool trans_a, trans_b;
  double alpha, beta;
  int layout;  // 0 tight; 1 padded leading dims; 2 misaligned by one element; 3 both
  int threads = 1;
};

std::string describe(const Case& c) {
  return "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
         " trans_a=" + std::to_string(c.trans_a) + " trans_b=" + std::to_string(c.trans_b) +
         " alpha=" + std::to_string(c.alpha) + " beta=" + std::to_string(c.beta) +
         " layout=" + std::to_string(c.layout) + " threads=" + std::to_string(c.threads);
}

// One gemm call against the long-double twin. With integer inputs (and dyadic alpha, beta) every
// rounding is exact and C must equal the twin. With N(0, 1) inputs the bound is the standard one
// for a sum of products: each C[i, j] is a sum of K products alpha a_ik b_kj and beta c_ij, and no
// term goes through more than K + 2 roundings (its product, the additions in its kc slice, one per
// later slice merged into C, alpha and beta), so
//   |C - exact| <= gamma_{K+2}(u) (|alpha| sum_k |a_ik| |b_kj| + |beta| |c_ij|),
// u = 2^-24 (float) or 2^-53 (double), plus the twin's own error, the same bound with u = 2^-64.
// Returns the number of elements out of bounds (0 expected), and checks that no padding changed.
template <class T>
int64_t run_against_twin(const Case& c, Rng& rng, bool integers) {
  const int64_t pad_a = c.layout & 1 ? 3 : 0, pad_b = c.layout & 1 ? 1 : 0, pad_c = c.layout & 1 ? 2 : 0;
  const int64_t off = c.layout & 2 ? 1 : 0;
  Mat<T> A = c.trans_a ? Mat<T>(c.K, c.M, pad_a, off) : Mat<T>(c.M, c.K, pad_a, off);
  Mat<T> B = c.trans_b ? Mat<T>(c.N, c.K, pad_b, off) : Mat<T>(c.K, c.N, pad_b, off);
  Mat<T> C(c.M, c.N, pad_c, off);
  fill(A, rng, integers);
  fill(B, rng, integers);
  if (c.beta != 0) fill(C, rng, integers);  // beta == 0: C stays NaN and must be overwritten
  const Mat<T> C0 = C;
  auto a = [&](int64_t i, int64_t k) { return c.trans_a ? A(k, i) : A(i, k); };
  auto b = [&](int64_t k, int64_t j) { return c.trans_b ? B(j, k) : B(k, j); };

  gemm<T>(c.trans_a, c.trans_b, c.M, c.N, c.K, T(c.alpha), A.data(), A.ld, B.data(), B.ld, T(c.beta), C.data(), C.ld,
          nullptr, c.threads);

  const long double alpha = c.alpha, beta = c.beta;
  int64_t bad = 0;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      long double sum = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const long double p = (long double)a(i, k) * (long double)b(k, j);
        sum += p;
        mag += std::fabs(p);
      }
      const long double c0 = beta == 0 ? 0.0L : (long double)C0(i, j);
      const long double exact = alpha * sum + beta * c0;
      const long double scale = std::fabs(alpha) * mag + std::fabs(beta) * std::fabs(c0);
      const long double tol =
          integers ? 0.0L : (gamma_n(c.K + 2, unit_roundoff<T>()) + gamma_n(c.K + 2, 0x1p-64L)) * scale;
      const long double got = C(i, j);
      if (!(std::fabs(got - exact) <= tol)) {
        if (bad == 0)
          UNSCOPED_INFO("first bad element C[" << i << ", " << j << "] = " << double(got) << ", expected "
                                               << double(exact) << " within " << double(tol));
        ++bad;
      }
    }
  if (!C.pads_untouched()) ++bad, UNSCOPED_INFO("C's padding was written");
  return bad;
}

// The sizes the brief of each path makes interesting: 0, 1, 2, its register tile and blocks +-1,
// and a few hundred.
std::vector<int64_t> edge_sizes(const GemmBlocking& bs) {
  const std::set<int64_t> s{0,         1,         2,         bs.mr - 1, bs.mr,     bs.mr + 1, bs.nr - 1,
                            bs.nr + 1, bs.kc - 1, bs.kc + 1, bs.mc - 1, bs.mc + 1, 300};
  return {s.begin(), s.end()};
}

// Every edge size in each dimension with the other two held at ragged companions, under all four
// transpose combinations, cycling through alpha and beta and the four layouts.
std::vector<Case> edge_cases(const GemmBlocking& bs) {
  const int64_t m0 = 2 * bs.mr + 1, n0 = bs.nr + 3, k0 = 7;
  const double ab[][2] = {{1, 0}, {1, 1}, {-0.75, 0.5}, {0.5, 0}, {2, -1}};
  std::vector<Case> cases;
  int n = 0;
  for (int64_t v : edge_sizes(bs))
    for (const std::array<int64_t, 3>& dims : {std::array<int64_t, 3>{v, n0, k0}, {m0, v, k0}, {m0, n0, v}})
      for (int t = 0; t < 4; ++t, ++n)
        cases.push_back({dims[0], dims[1], dims[2], bool(t & 1), bool(t & 2), ab[n % 5][0], ab[n % 5][1], n % 4});
  return cases;
}

}  // namespace

TEMPLATE_TEST_CASE("gemm micro-kernels agree exactly with the three-loop reference on integers", "[gemm]", float,
                   double) {
  // Integers in [-4, 4], kc <= 300: every product and sum is exact, so the fast micro-kernel and the
  // reference must agree bit for bit whatever their order of operations. A packed by columns, and
  // A read in place from a row-major matrix with a wider row stride; the full tile and the narrower
  // tiles its last vector masks (n from nr - lanes + 1 to nr); C's columns from n on untouched.
  using T = TestType;
  Rng rng(101);
  for (GemmIsa isa : available_isas()) {
    const gemm_detail::KernelInfo<T> info = gemm_detail::kernel_info<T>(isa);
    const int mr = info.blocking.mr, nr = info.blocking.nr, lanes = info.lanes;
    const int64_t KC = info.blocking.kc;
    for (int64_t kc : {int64_t(0), int64_t(1), int64_t(2), KC - 1, KC, KC + 1, int64_t(300)})
      for (const int n : std::set<int>{nr, nr - 1, nr - lanes / 2, nr - lanes + 1})
        for (const bool packed : {true, false})
          for (const auto& ab : {std::pair<double, double>{1, 0}, {1, 1}, {-2, 0.5}, {0.5, -1}}) {
            if (n <= nr - lanes) continue;  // the scalar path (lanes 1) has only n = nr
            CAPTURE(to_string(isa), mr, nr, n, kc, packed, ab.first, ab.second);
            const int64_t rs_a = packed ? 1 : kc + 3, cs_a = packed ? mr : 1;
            std::vector<T> A(size_t(packed ? mr * kc : mr * rs_a)), B(size_t(kc * nr));
            for (T& x : A) x = T(rng.integer(-4, 4));
            for (T& x : B) x = T(rng.integer(-4, 4));
            const int64_t ldc = nr + 5;  // wider than the tile: columns n.. must stay NaN
            std::vector<T> C(size_t(mr * ldc), T(kNaN));
            if (ab.second != 0)
              for (int i = 0; i < mr; ++i)
                for (int j = 0; j < n; ++j) C[size_t(i * ldc + j)] = T(rng.integer(-4, 4));
            std::vector<T> fast = C, ref = C;
            info.kernel(kc, A.data(), rs_a, cs_a, B.data(), fast.data(), ldc, n, T(ab.first), T(ab.second));
            gemm_detail::reference_microkernel<T>(mr, nr, kc, A.data(), rs_a, cs_a, B.data(), ref.data(), ldc, n,
                                                  T(ab.first), T(ab.second));
            int64_t bad = 0;
            for (int i = 0; i < mr; ++i)
              for (int64_t j = 0; j < ldc; ++j) {
                const T f = fast[size_t(i * ldc + j)], r = ref[size_t(i * ldc + j)];
                if (j < n ? !(f == r) : !(std::isnan(f) && std::isnan(r))) ++bad;
              }
            CHECK(bad == 0);
          }
  }
}

TEMPLATE_TEST_CASE("gemm on every path matches its long-double twin on edge sizes", "[gemm]", float, double) {
  using T = TestType;
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const GemmBlocking bs = gemm_detail::kernel_info<T>(isa).blocking;
    Rng rng(202);
    for (const Case& c : edge_cases(bs)) {
      CAPTURE(to_string(isa), describe(c));
      CHECK(run_against_twin<T>(c, rng, true) == 0);   // exact
      CHECK(run_against_twin<T>(c, rng, false) == 0);  // within the bound
    }
  }
}

TEMPLATE_TEST_CASE("gemm over several MC KC and NC blocks and on two or three threads", "[gemm]", float, double) {
  // The loops around the macro-kernel: more than one block of rows (mc), of depth (kc) and of
  // columns (nc), each ragged, one dimension at a time (the others small, to keep the twin cheap),
  // and the same shapes split over threads that share the packed B.
  using T = TestType;
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const GemmBlocking bs = gemm_detail::kernel_info<T>(isa).blocking;
    Rng rng(303);
    const std::vector<Case> shapes{{2 * bs.mc + bs.mr + 1, bs.nr + 1, bs.kc + 1, false, true, 1, 0, 0},
                                   {3, bs.nc + bs.nr + 1, 2 * bs.kc + 1, true, false, 1, 1, 3},
                                   {3 * bs.mr + 2, 2 * bs.nr + 1, 3 * bs.kc + 2, false, false, -0.5, 2, 2},
                                   {bs.mc + 5, bs.nr + 7, 2 * bs.kc + 3, true, true, 1, 0, 1}};
    for (int threads : {1, 2, 3})
      for (Case c : shapes) {
        c.threads = threads;
        CAPTURE(to_string(isa), describe(c));
        CHECK(run_against_twin<T>(c, rng, false) == 0);
      }
  }
}

TEMPLATE_TEST_CASE("gemm on several threads, rows dealt out or in fixed shares, gives one thread's bits", "[gemm]",
                   float, double) {
  // On more than one thread the rows of C are dealt out slice by slice as the threads come for them
  // (gemm_detail::set_row_dealing, on by default), or each thread takes a fixed share. Either way C
  // must be one thread's C bit for bit: every row computed once, by the same kernels, in the same
  // slices. Shapes over several mc, kc and nc blocks, M ragged against mr, both transposes, the
  // fused epilogue (bias, ReLU, residual) and one with an activation function, and the operand swap
  // (a few rows against a large transposed B). C starts as NaN (beta 0) and its padding as 7: a row
  // no thread computed stays NaN, a write past a row shows in the padding, and a row computed twice
  // shows where its later slices add to C again (K > kc) or its epilogue is applied again.
  using T = TestType;
  Rng rng(616);
  const SwitchBackOn restore{&gemm_detail::set_row_dealing};
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const GemmBlocking bs = gemm_detail::kernel_info<T>(isa).blocking;
    struct Shape {
      int64_t M, N, K;
      bool trans_a, trans_b;
    };
    const int64_t mc = bs.mc, nc = bs.nc, kc = bs.kc, mr = bs.mr, nr = bs.nr;
    for (const Shape s : {Shape{2 * mc + mr + 1, nr + 3, kc + 1, false, true}, Shape{5 * mr + 1, nc + nr + 1, 2 * kc + 1, false, true},
                          Shape{mc + 5, 2 * nr + 1, 2 * kc + 3, true, false}, Shape{97, 3 * nr + 7, 33, true, true},
                          Shape{2 * nr, 3000, kc + 9, false, true}})
      for (int variant = 0; variant < 3; ++variant) {
        const int64_t lda = (s.trans_a ? s.M : s.K) + 3, ldb = (s.trans_b ? s.K : s.N) + 1, ldc = s.N + 2;
        std::vector<T> A(size_t((s.trans_a ? s.K : s.M) * lda)), B(size_t((s.trans_b ? s.N : s.K) * ldb));
        std::vector<T> bias(size_t(s.N)), res(size_t(s.M * s.N));
        for (T& x : A) x = T(rng.normal());
        for (T& x : B) x = T(rng.normal());
        for (T& x : bias) x = T(rng.normal());
        for (T& x : res) x = T(rng.normal());
        GemmEpilogue<T> ep;
        if (variant == 1) ep.bias = bias.data(), ep.relu = true, ep.residual = res.data(), ep.ldr = s.N;
        if (variant == 2) ep.bias = bias.data(), ep.activation = &gelu_forward<T>;
        auto run = [&](int threads, bool dealt) {
          std::vector<T> C(size_t(s.M * ldc), T(7));
          for (int64_t i = 0; i < s.M; ++i)
            for (int64_t j = 0; j < s.N; ++j) C[size_t(i * ldc + j)] = T(kNaN);
          gemm_detail::set_row_dealing(dealt);
          gemm<T>(s.trans_a, s.trans_b, s.M, s.N, s.K, T(1), A.data(), lda, B.data(), ldb, T(0), C.data(), ldc,
                  variant ? &ep : nullptr, threads);
          return C;
        };
        const std::vector<T> one = run(1, true);
        size_t nan = 0;
        for (T x : one) nan += std::isnan(x);
        REQUIRE(nan == 0);  // the one-thread result is whole: NaN below could only come from a skipped row
        for (int threads : {2, 3, 4})
          for (bool dealt : {true, false}) {
            CAPTURE(to_string(isa), s.M, s.N, s.K, s.trans_a, s.trans_b, variant, threads, dealt);
            const std::vector<T> c = run(threads, dealt);
            CHECK(std::memcmp(c.data(), one.data(), one.size() * sizeof(T)) == 0);
          }
      }
  }
}

TEMPLATE_TEST_CASE("gemm with alpha 0 or K 0 reads neither A nor B and beta 0 clears NaN", "[gemm]", float, double) {
  using T = TestType;
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    CAPTURE(to_string(isa));
    const int64_t M = 5, N = 7, K = 3;
    std::vector<T> A(size_t(M * K), T(kNaN)), B(size_t(K * N), T(kNaN)), C(size_t(M * N), T(2));
    // alpha == 0: C = beta * C, the NaN in A and B never read.
    gemm<T>(false, false, M, N, K, T(0), A.data(), K, B.data(), N, T(1.5), C.data(), N);
    for (T x : C) CHECK(x == T(3));
    // K == 0: the empty sum is 0, C = beta * C; beta == 0 writes zeros over NaN.
    std::fill(C.begin(), C.end(), T(kNaN));
    gemm<T>(false, false, M, N, 0, T(1), A.data(), 1, B.data(), N, T(0), C.data(), N);
    for (T x : C) CHECK(x == T(0));
    // M == 0 or N == 0: nothing to do, nothing touched.
    std::fill(C.begin(), C.end(), T(7));
    gemm<T>(false, false, 0, N, K, T(1), A.data(), K, B.data(), N, T(0), C.data(), N);
    gemm<T>(false, false, M, 0, K, T(1), A.data(), K, B.data(), 1, T(0), C.data(), 1);
    for (T x : C) CHECK(x == T(7));
  }
}

namespace {

template <class T>
void relu(T* out, const T* inp, int64_t n) {
  relu_forward(out, inp, n);
}
template <class T>
void gelu(T* out, const T* inp, int64_t n) {
  gelu_forward(out, inp, n);
}

// The epilogue's result computed the unfused way: gemm, then bias, activation and residual as the
// core's ops do them, pass by pass over the whole of C.
template <class T>
void unfused(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
             int64_t ldb, T beta, T* C, int64_t ldc, const GemmEpilogue<T>& ep) {
  gemm<T>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  for (int64_t i = 0; i < M; ++i) {
    T* c = C + i * ldc;
    if (ep.bias)
      for (int64_t j = 0; j < N; ++j) c[j] = c[j] + ep.bias[j];
    if (ep.relu) relu_forward(c, c, N);
    if (ep.activation) ep.activation(c, c, N);
    if (ep.residual) add_forward(c, c, ep.residual + i * ep.ldr, N);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("gemm epilogue equals the unfused passes bit for bit", "[gemm]", float, double) {
  // Same operations in the same order, so the fused result must be identical, not merely close.
  using T = TestType;
  Rng rng(404);
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const GemmBlocking bs = gemm_detail::kernel_info<T>(isa).blocking;
    struct Shape {
      int64_t M, N, K;
    };
    // (the last two: the two-panel narrow kernel at the right edge (B not transposed: the transposed
    // variants may take the operand swap there), and columns past nc)
    for (const Shape s : {Shape{1, 1, 1}, Shape{bs.mr + 1, bs.nr + 1, bs.kc + 1}, Shape{37, 70, 19},
                          Shape{2 * bs.mr, 2 * bs.nr, 3}, Shape{9, 11, 0}, Shape{4 * bs.mr, 4 * bs.nr + 1, 5},
                          Shape{2 * bs.mr, bs.nc + bs.nr + 1, 3}})
      for (int variant = 0; variant < 9; ++variant)
        for (int threads : {1, 2}) {
          const bool tb = variant % 2 == 1;
          const T beta = variant == 3 || variant == 7 ? T(0.5) : T(0);
          CAPTURE(to_string(isa), s.M, s.N, s.K, variant, threads);
          std::vector<T> A(size_t(s.M * s.K)), B(size_t(s.K * s.N)), bias(size_t(s.N)), res(size_t(s.M * (s.N + 3)));
          for (T& x : A) x = T(rng.normal());
          for (T& x : B) x = T(rng.normal());
          for (T& x : bias) x = T(rng.normal());
          for (T& x : res) x = T(rng.normal());
          GemmEpilogue<T> ep;
          if (variant != 2 && variant != 8) ep.bias = bias.data();
          if (variant == 1 || variant == 4) ep.activation = &gelu<T>;
          if (variant == 2 || variant == 5) ep.activation = &relu<T>;
          ep.relu = variant >= 6;  // the micro-kernel's own ReLU (bias and residual in its registers too)
          if (variant >= 2 && variant != 6) ep.residual = res.data(), ep.ldr = s.N + 3;
          std::vector<T> fused(size_t(s.M * s.N)), ref(size_t(s.M * s.N));
          for (size_t e = 0; e < fused.size(); ++e) fused[e] = ref[e] = T(rng.normal());
          const int64_t lda = s.K > 0 ? s.K : 1, ldb = tb ? lda : (s.N > 0 ? s.N : 1);
          // alpha 0.7 (not exact): a product of alpha fused with the epilogue's add would change bits
          const T alpha = variant >= 6 ? T(0.7) : T(1);
          gemm<T>(false, tb, s.M, s.N, s.K, alpha, A.data(), lda, B.data(), ldb, beta, fused.data(), s.N, &ep, threads);
          unfused<T>(false, tb, s.M, s.N, s.K, alpha, A.data(), lda, B.data(), ldb, beta, ref.data(), s.N, ep);
          CHECK(std::memcmp(fused.data(), ref.data(), fused.size() * sizeof(T)) == 0);
        }
  }
}

TEMPLATE_TEST_CASE("gemm's fused ReLU is relu_forward's on -0, NaN and infinities", "[gemm]", float, double) {
  // alpha = -1 turns a zero row's +0 sums into -0 (ReLU: +0), a NaN in A gives NaN rows (kept), an
  // infinity gives -inf or +inf; whole tiles (fused in the micro-kernel) and edge tiles alike.
  using T = TestType;
  Rng rng(405);
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const GemmBlocking bs = gemm_detail::kernel_info<T>(isa).blocking;
    const int64_t M = 2 * bs.mr + 1, N = bs.nr + 3, K = 5;
    std::vector<T> A(size_t(M * K)), B(size_t(N * K)), res(size_t(M * N));
    for (T& x : A) x = T(rng.normal());
    for (T& x : B) x = T(rng.normal());
    for (T& x : res) x = T(rng.normal());
    for (int64_t k = 0; k < K; ++k) A[size_t(0 * K + k)] = T(0), A[size_t((M - 1) * K + k)] = T(0);
    A[size_t(1 * K + 2)] = nan;
    A[size_t(2 * K + 1)] = inf;
    for (int with_residual = 0; with_residual < 2; ++with_residual) {
      CAPTURE(to_string(isa), with_residual);
      GemmEpilogue<T> ep;
      ep.relu = true;
      if (with_residual) ep.residual = res.data(), ep.ldr = N;
      std::vector<T> fused(size_t(M * N)), ref(size_t(M * N));
      gemm<T>(false, true, M, N, K, T(-1), A.data(), K, B.data(), K, T(0), fused.data(), N, &ep);
      unfused<T>(false, true, M, N, K, T(-1), A.data(), K, B.data(), K, T(0), ref.data(), N, ep);
      CHECK(std::memcmp(fused.data(), ref.data(), fused.size() * sizeof(T)) == 0);
      if (!with_residual) {
        CHECK_FALSE(std::signbit(fused[0]));  // -0 -> +0, on a whole tile's row and an edge tile's
        CHECK(fused[0] == T(0));
        CHECK_FALSE(std::signbit(fused[size_t((M - 1) * N)]));
        CHECK(std::isnan(fused[size_t(N)]));
      }
    }
  }
}

TEMPLATE_TEST_CASE("gemm's operand swap for a few rows against a large transposed B changes no bit", "[gemm]", float,
                   double) {
  // M from nr to 256 rows, below N, op(B) = B^T, beta 0: gemm swaps the operands (C^T = B op(A)^T,
  // then transposed, the epilogue after). Each element is the same chain of FMAs over k, so C must
  // be identical to the unswapped call's, epilogues (the library's own GELU and ReLU, vectorised with
  // a scalar tail) and threads included; and shapes outside the swap's range go through untouched.
  // (The swap runs on the paths of 8 lanes or more, AVX-512 and AVX2 float; elsewhere this compares
  // the plain call with itself.)
  using T = TestType;
  Rng rng(515);
  const SwitchBackOn restore{&gemm_detail::set_operand_swap};
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    const GemmBlocking bs = gemm_detail::kernel_info<T>(isa).blocking;
    struct Shape {
      int64_t M, N, K;
    };
    // (K 100 and kc + 37: slices of whole cache lines of k steps and a part of one, as the micro-kernel
    // walks them when it asks for a streaming weight's next panel)
    for (const Shape s : {Shape{int64_t(bs.nr), int64_t(bs.nr) + 1, 5}, Shape{100, 3 * int64_t(bs.nr) + 7, bs.kc + 9},
                          Shape{256, 700, 2 * int64_t(bs.kc) + 1}, Shape{130, 131, 64}, Shape{300, 900, 33},
                          Shape{128, 300, 100}, Shape{70, 2 * int64_t(bs.nr) + 11, bs.kc + 37}})
      for (int variant = 0; variant < 5; ++variant)
        for (int threads : {1, 2}) {
          CAPTURE(to_string(isa), s.M, s.N, s.K, variant, threads);
          // variant 4: alpha 0.5 and every row stride past its row (A's, B's, C's)
          const int64_t lda = s.K + (variant == 4 ? 3 : 0), ldb = s.K + (variant == 4 ? 5 : 0),
                        ldc = s.N + (variant == 4 ? 2 : 0);
          const T alpha = variant == 4 ? T(0.5) : T(1);
          std::vector<T> A(size_t(s.M * lda)), B(size_t(s.N * ldb)), bias(size_t(s.N)), res(size_t(s.M * s.N));
          for (T& x : A) x = T(rng.normal());
          for (T& x : B) x = T(rng.normal());
          for (T& x : bias) x = T(rng.normal());
          for (T& x : res) x = T(rng.normal());
          GemmEpilogue<T> ep;
          if (variant >= 1) ep.bias = bias.data();
          if (variant == 2) ep.activation = &gelu_forward<T>;
          if (variant == 3) ep.activation = &relu_forward<T>, ep.residual = res.data(), ep.ldr = s.N;
          if (variant == 4) ep.bias = bias.data(), ep.activation = &gelu_forward<T>;
          // C's padding past each row keeps its 7: the same in both only if neither call writes it
          std::vector<T> swapped(size_t(s.M * ldc), T(7)), plain(swapped.size(), T(7));
          gemm_detail::set_operand_swap(true);
          gemm<T>(false, true, s.M, s.N, s.K, alpha, A.data(), lda, B.data(), ldb, T(0), swapped.data(), ldc,
                  variant ? &ep : nullptr, threads);
          gemm_detail::set_operand_swap(false);
          gemm<T>(false, true, s.M, s.N, s.K, alpha, A.data(), lda, B.data(), ldb, T(0), plain.data(), ldc,
                  variant ? &ep : nullptr, threads);
          CHECK(std::memcmp(swapped.data(), plain.data(), plain.size() * sizeof(T)) == 0);
        }
  }
}

TEMPLATE_TEST_CASE("gemm_strided_batched equals a loop of gemm calls", "[gemm]", float, double) {
  // Attention's shapes: q k^T over (batch * heads), T = 37, head dim 16; the residual strided per
  // matrix, the bias shared; one thread and three.
  using T = TestType;
  Rng rng(505);
  const int64_t batch = 6, M = 37, N = 41, K = 16;
  const int64_t sa = M * K + 3, sb = N * K + 5, sc = M * N + 7, sr = M * N;
  std::vector<T> A(size_t(batch * sa)), B(size_t(batch * sb)), bias(static_cast<size_t>(N)), res(size_t(batch * sr));
  for (T& x : A) x = T(rng.normal());
  for (T& x : B) x = T(rng.normal());
  for (T& x : bias) x = T(rng.normal());
  for (T& x : res) x = T(rng.normal());
  GemmEpilogue<T> ep;
  ep.bias = bias.data();
  ep.residual = res.data();
  ep.ldr = N;
  for (GemmIsa isa : available_isas()) {
    const ForceIsa force(isa);
    for (int threads : {1, 3}) {
      CAPTURE(to_string(isa), threads);
      std::vector<T> batched(size_t(batch * sc), T(kNaN)), looped(size_t(batch * sc), T(kNaN));
      gemm_strided_batched<T>(batch, false, true, M, N, K, T(0.25), A.data(), K, sa, B.data(), K, sb, T(0),
                              batched.data(), N, sc, &ep, sr, threads);
      for (int64_t b = 0; b < batch; ++b) {
        GemmEpilogue<T> epb = ep;
        epb.residual = res.data() + b * sr;
        gemm<T>(false, true, M, N, K, T(0.25), A.data() + b * sa, K, B.data() + b * sb, K, T(0), looped.data() + b * sc,
                N, &epb);
      }
      int64_t bad = 0;
      for (size_t e = 0; e < batched.size(); ++e)
        if (!(batched[e] == looped[e] || (std::isnan(batched[e]) && std::isnan(looped[e])))) ++bad;
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("gemm isa: names and availability and forcing and TPARITY_ISA", "[gemm]") {
  for (GemmIsa isa : {GemmIsa::Scalar, GemmIsa::Avx2, GemmIsa::Avx512}) CHECK(parse_gemm_isa(to_string(isa)) == isa);
  CHECK(std::string(to_string(GemmIsa::Avx512)) == "avx512");
  CHECK_THROWS_WITH(parse_gemm_isa("sse4"), Contains("sse4") && Contains("scalar, avx2 or avx512"));
  CHECK(gemm_isa_available(GemmIsa::Scalar));

  // Forcing: an available path is taken; an unavailable one is refused, naming it and what it lacks.
  // (On a CPU with AVX-512 every path is available and the refusal branch has nothing to refuse.)
  for (GemmIsa isa : {GemmIsa::Scalar, GemmIsa::Avx2, GemmIsa::Avx512}) {
    CAPTURE(to_string(isa));
    if (gemm_isa_available(isa)) {
      const ForceIsa force(isa);
      CHECK(gemm_isa() == isa);
    } else {
      CHECK_THROWS_WITH(gemm_force_isa(isa), Contains(to_string(isa)) && Contains("does not have"));
      CHECK_THROWS_WITH(gemm_detail::kernel_info<float>(isa), Contains(to_string(isa)));
    }
  }
  // Available paths form a ladder: AVX-512 implies AVX2 here (both need FMA).
  if (gemm_isa_available(GemmIsa::Avx512)) CHECK(gemm_isa_available(GemmIsa::Avx2));

  // TPARITY_ISA, read again after gemm_reset_isa(); the environment restored at the end.
  const char* old = std::getenv("TPARITY_ISA");
  const std::string saved = old ? old : "";
  struct Restore {
    const char* old;
    std::string saved;
    ~Restore() {
      if (old)
        setenv("TPARITY_ISA", saved.c_str(), 1);
      else
        unsetenv("TPARITY_ISA");
      gemm_reset_isa();
    }
  } restore{old, saved};

  unsetenv("TPARITY_ISA");
  gemm_reset_isa();
  const GemmIsa best = gemm_isa_available(GemmIsa::Avx512) ? GemmIsa::Avx512
                       : gemm_isa_available(GemmIsa::Avx2) ? GemmIsa::Avx2
                                                           : GemmIsa::Scalar;
  CHECK(gemm_isa() == best);

  setenv("TPARITY_ISA", "scalar", 1);
  gemm_reset_isa();
  CHECK(gemm_isa() == GemmIsa::Scalar);

  setenv("TPARITY_ISA", "bogus", 1);
  gemm_reset_isa();
  CHECK_THROWS_WITH(gemm_isa(), Contains("TPARITY_ISA") && Contains("bogus"));
  float a = 1, b = 1, c = 0;
  CHECK_THROWS_WITH(gemm<float>(false, false, 1, 1, 1, 1.f, &a, 1, &b, 1, 0.f, &c, 1), Contains("TPARITY_ISA"));
  // Forcing overrides a bad variable.
  gemm_force_isa(GemmIsa::Scalar);
  CHECK(gemm_isa() == GemmIsa::Scalar);

  for (GemmIsa isa : {GemmIsa::Avx2, GemmIsa::Avx512})
    if (!gemm_isa_available(isa)) {
      setenv("TPARITY_ISA", to_string(isa), 1);
      gemm_reset_isa();
      CHECK_THROWS_WITH(gemm_isa(), Contains("TPARITY_ISA") && Contains("does not have"));
    }
}

TEST_CASE("gemv_forward: each output row the same bits whatever rows share the call, near its exact value",
          "[gemm]") {
  // The GEMV takes several weight rows at a time (AVX-512 float: 4, or 8 on Intel CPUs, both forced
  // here in turn; gemv.cpp) and the rest one by one; each output is one chain of FMAs over k in
  // lanes, then the lanes' sum, so a row computed alone (OC = 1) must give the same bits as inside a
  // call of 7, 8 or 19 rows. And each within the dot product's bound of a long-double sum:
  // |y - exact| <= gamma_{C+1} sum |w x| (Higham 3.1).
  struct Restore {
    ~Restore() { gemv_detail::set_rows_per_step(0); }
  } restore;
  CHECK_THROWS_AS(gemv_detail::set_rows_per_step(5), std::invalid_argument);
  Rng rng(2024);
  for (GemmIsa isa : available_isas())
    for (const int rows : {4, 8}) {
      gemv_detail::set_rows_per_step(rows);
      const ForceIsa force(isa);
      for (const int64_t C : {int64_t(1), int64_t(15), int64_t(16), int64_t(300), int64_t(1029)})
        for (const int64_t OC : {int64_t(1), int64_t(7), int64_t(8), int64_t(19)}) {
          CAPTURE(to_string(isa), rows, C, OC);
          std::vector<float> x(size_t(2 * C)), w(size_t(OC * C)), y(size_t(2 * OC));
          for (float& v : x) v = float(rng.normal());
          for (float& v : w) v = float(rng.normal());
          gemv_forward(y.data(), x.data(), w.data(), static_cast<const float*>(nullptr), int64_t(2), C, OC);
          int64_t differ = 0, far = 0;
          for (int64_t n = 0; n < 2; ++n)
            for (int64_t o = 0; o < OC; ++o) {
              float alone = 0;
              const float* none = nullptr;
              gemv_forward(&alone, x.data() + n * C, w.data() + o * C, none, int64_t(1), C, int64_t(1));
              const float got = y[size_t(n * OC + o)];
              differ += std::memcmp(&alone, &got, sizeof(float)) != 0;
              long double exact = 0, mag = 0;
              for (int64_t c = 0; c < C; ++c) {
                const long double p = (long double)w[size_t(o * C + c)] * x[size_t(n * C + c)];
                exact += p, mag += std::fabs(p);
              }
              const long double u = std::ldexp(1.0L, -24), gamma = (C + 1) * u / (1 - (C + 1) * u);
              far += std::fabs((long double)got - exact) > gamma * mag;
            }
          CHECK(differ == 0);
          CHECK(far == 0);
        }
    }
}
