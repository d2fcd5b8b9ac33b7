// The GEMM's scalar path: the same micro-kernel over one element per "register", for CPUs without
// AVX2 (and builds that are not x86-64). Compiled with the project's baseline flags; without FMA
// hardware, fma() here rounds the product and the sum separately (the compiler may not contract
// them: -ffp-contract=off, CMakeLists.txt).
#include "gemm_driver.hpp"

namespace tparity::gemm_impl {
namespace {

template <class E>
struct Scalar {
  using T = E;
  using V = E;
  static constexpr int width = 1;
  static V zero() { return V(0); }
  static V load(const T* p) { return *p; }
  static void store(T* p, V v) { *p = v; }
  static V load_first(const T* p, int) { return *p; }  // width 1: never partial
  static void store_first(T* p, V v, int) { *p = v; }
  static V broadcast(T x) { return x; }
  static V mul(V a, V b) { return a * b; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static void transpose(const T* src, int64_t, T* dst, int64_t) { *dst = *src; }
};

}  // namespace

template <>
Path<float> scalar_path<float>() {
  return SimdPath<Scalar<float>, Blocks::scalar_float>::path();
}
template <>
Path<double> scalar_path<double>() {
  return SimdPath<Scalar<double>, Blocks::scalar_double>::path();
}

}  // namespace tparity::gemm_impl
