// The elementary ops against hand-worked answers, invariants and scalar twins.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "support.hpp"
#include "tparity/core/ops.hpp"
#include "tparity/harness/rng.hpp"

using namespace tparity;
using test::ScopedCorePath;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Scalar twin of dot(): one long double accumulator, left to right.
long double dot_twin(const double* a, const double* b, int64_t n) {
  long double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += (long double)a[i] * (long double)b[i];
  return acc;
}

// Whether the kernel may give this process transparent huge pages where it asks: the mode
// (/sys/kernel/mm/transparent_hugepage/enabled) "madvise", and THP not turned off for the process
// (/proc/self/status' THP_enabled, prctl PR_SET_THP_DISABLE, which a container may pass down).
bool thp_on_advice() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(f, line) || line.find("[madvise]") == std::string::npos) return false;
  std::ifstream st("/proc/self/status");
  while (std::getline(st, line))
    if (line.rfind("THP_enabled:", 0) == 0) return std::stoi(line.substr(12)) == 1;
  return false;
}

// /proc/self/smaps on the mapping holding p: its THPeligible (0 or 1), -2 when it has no such field,
// -1 when no mapping holds p.
int thp_eligible(const void* p) {
  std::ifstream f("/proc/self/smaps");
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false, found = false;
  while (std::getline(f, line)) {
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      if (inside) return -2;  // the mapping ended without the field
      inside = addr >= lo && addr < hi;
      found = found || inside;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) return std::stoi(line.substr(12));
  }
  return found ? -2 : -1;
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;  // large blocks from the aligned malloc (src/core/tensor.cpp)
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

}  // namespace

TEST_CASE("tensors of 2 MiB and more start on a 2 MiB boundary, advised onto huge pages", "[ops][tensor]") {
  const Tensor<float> big({int64_t(1) << 20});  // 4 MiB
  REQUIRE(reinterpret_cast<uintptr_t>(big.ptr()) % kHugeBlock == 0);
  CHECK(std::count(big.data.begin(), big.data.end(), 0.0f) == big.numel());
  if (thp_on_advice())
    CHECK(thp_eligible(big.ptr()) == 1);
  else
    WARN("transparent huge pages not given on advice here: the advice not checked");
  // A storage grown element by element across the threshold and back: each block freed as it was
  // taken (operator new / the large path; the sanitizer build reports a mismatch), the elements kept.
  Storage<double> s;
  for (int i = 0; i < (1 << 19); ++i) s.push_back(double(i));
  Storage<double> copy = s;
  REQUIRE(copy.size() == size_t(1) << 19);
  CHECK(copy[12345] == 12345.0);
  CHECK(copy.back() == double((1 << 19) - 1));
  copy.resize(10);
  copy.shrink_to_fit();
  CHECK(copy[9] == 9.0);
  const Tensor<double> from_plain({3}, std::vector<double>{1, 2, 3});
  CHECK(from_plain.data == std::vector<double>{1, 2, 3});
  // Code written against `std::vector<T> data` (examples/naive_attention) still builds: the storage
  // converts to a plain vector, a copy (this file does not compile without the conversion).
  auto sum_plain = [](const std::vector<double>& v) { return v.empty() ? -1.0 : v[0] + v[1] + v[2]; };
  CHECK(sum_plain(from_plain.data) == 6.0);
  const bool present = true;
  const std::vector<double> chosen = present ? from_plain.data : std::vector<double>{};
  CHECK(chosen == std::vector<double>{1, 2, 3});
}

TEST_CASE("freed large blocks are kept for their length, the oldest handed back past the limit", "[ops][tensor]") {
  if (kSanitized) {
    WARN("the sanitizer build takes large blocks from malloc: nothing kept to check");
    return;
  }
  REQUIRE(thp_eligible(&kHugeBlock) != -1);  // smaps readable: a mapping holds this constant
  release_kept_memory();
  const int64_t n = int64_t(3) << 18;  // floats: 3 MiB
  const float* first = nullptr;
  {
    Tensor<float> a({n});
    first = a.ptr();
    a.data[12345] = 7.0f;
  }
  CHECK(thp_eligible(first) != -1);  // still mapped: kept, not handed back
  {
    const Tensor<float> b({n});
    CHECK(b.ptr() == first);
    CHECK(b.data[12345] == 0.0f);  // a new tensor's zeros, whatever the block held
    if (thp_on_advice()) CHECK(thp_eligible(b.ptr()) == 1);
  }
  release_kept_memory();
  CHECK(thp_eligible(first) == -1);  // handed back to the kernel
  // A limit of 8 MiB: three freed blocks of 3 MiB and more (three lengths) keep the last two only.
  const size_t before = set_kept_memory_limit(size_t(8) << 20);
  const float* p[3] = {};
  {
    Tensor<float> x({n}), y({n + 1024}), z({n + 2048});
    p[0] = x.ptr(), p[1] = y.ptr(), p[2] = z.ptr();
  }  // freed z, y, x in that order: z is the oldest
  CHECK(thp_eligible(p[2]) == -1);
  CHECK(thp_eligible(p[1]) != -1);
  CHECK(thp_eligible(p[0]) != -1);
  set_kept_memory_limit(0);  // none kept: every block handed back
  CHECK(thp_eligible(p[1]) == -1);
  CHECK(thp_eligible(p[0]) == -1);
  set_kept_memory_limit(before);
}

TEST_CASE("storage makes zeros every way a vector does, an unset tensor left as its block held it", "[ops][tensor]") {
  // The allocator leaves an element it is asked to value-initialise unset inside resize_unset alone
  // (Tensor::unset's own purpose); every std::vector way of making elements of none must still give
  // zeros, the storage's own and the vector's under it alike. A freed large block is kept and handed
  // back for the same length (above), so each new storage here gets the block the last one filled
  // with 7s; the sanitizer build takes large blocks from malloc, which may hand back any.
  release_kept_memory();
  const int64_t n = int64_t(3) << 18;  // floats: 3 MiB
  auto sevens = [&] {
    Tensor<float> t({n}, 7.0f);
    return t.ptr();
  };
  auto all = [](const Storage<float>& s, float x) {
    return std::all_of(s.begin(), s.end(), [&](float y) { return y == x; });
  };
  const float* block = sevens();
  {
    const Storage<float> s(static_cast<size_t>(n));
    if (!kSanitized) CHECK(s.data() == block);
    CHECK(all(s, 0.0f));
  }
  sevens();
  {
    Storage<float> s;
    s.reserve(size_t(n));  // the block of 7s, no element made yet
    if (!kSanitized) CHECK(s.data() == block);
    s.emplace_back();  // made in place, in the block (emplace(pos) makes its element on the stack first)
    CHECK(s[0] == 0.0f);
    std::vector<float, TensorAllocator<float>>& v = s;  // a generic caller's view: the vector under it
    v.resize(size_t(n));
    CHECK(all(s, 0.0f));
  }
  sevens();
  {
    const Tensor<float> t = Tensor<float>::unset({n});
    CHECK(t.shape == Shape{n});
    REQUIRE(t.numel() == n);
    if (detail::unset_filled_with_nan()) {  // the library built with assertions: unwritten shows
      CHECK(std::all_of(t.data.begin(), t.data.end(), [](float x) { return std::isnan(x); }));
    } else if (!kSanitized) {
      CHECK(t.ptr() == block);
      CHECK(all(t.data, 7.0f));  // no pass of zeros: the block as the last tensor left it
    }
  }
  sevens();
  {
    Storage<float> s;
    s.reserve(size_t(n));
    s.resize_unset(4);
    s.resize(size_t(n));  // the flag was set for resize_unset's one call only
    if (!kSanitized) CHECK(s[0] == 7.0f);
    CHECK(std::all_of(s.begin() + 4, s.end(), [](float x) { return x == 0.0f; }));
  }
  CHECK_THROWS_AS(Tensor<float>::unset({kMaxTensorElements + 1}), ShapeError);
  release_kept_memory();
}

TEST_CASE("a child forked while another thread allocates can allocate large blocks", "[ops][tensor]") {
  // Another thread takes and frees a kept block in a loop (its lock held much of the time); each
  // child takes a large block and exits. Without the fork handlers, a child forked while the lock
  // was held would wait for it for ever: a fork safe for malloc must be safe for tensors too.
  if (kSanitized) {
    // There the large blocks are the sanitizer's posix_memalign, and clang 14's runtime is not safe
    // to fork beside it: a child hung in its LargeMmapAllocator's spin lock (gdb, 1 run in 10).
    WARN("the sanitizer build takes large blocks from its own allocator, which a fork can leave locked");
    return;
  }
  struct Churn {  // stopped and joined however the test ends
    std::atomic<bool> stop{false};
    std::thread thread{[this] {
      while (!stop.load(std::memory_order_relaxed)) {
        Storage<float> s;
        s.reserve(size_t(1) << 20);  // 4 MiB, not zero-filled: the loop is mostly the lock's work
      }
    }};
    ~Churn() {
      stop = true;
      thread.join();
    }
  } churn;
  int hung = 0, failed = 0;
  for (int i = 0; i < 200 && hung == 0; ++i) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // the child: no Catch, no unwinding into it
      try {
        Storage<float> s;
        s.reserve(size_t(1) << 20);
        _exit(s.capacity() == size_t(1) << 20 ? 0 : 1);
      } catch (...) {
        _exit(2);
      }
    }
    int status = 0;
    pid_t done = 0;
    for (int waited = 0; waited < 1000 && (done = waitpid(pid, &status, WNOHANG)) == 0; ++waited) usleep(10000);
    if (done == 0) {  // 10 s: the child is stuck
      ++hung;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
    }
  }
  CHECK(hung == 0);
  CHECK(failed == 0);
}

TEST_CASE("dot and sum of small integers are exact", "[ops]") {
  // 1*1 + 2*2 + ... + 20*20 = 20*21*41/6 = 2870: every partial sum is an integer below 2^24,
  // so float must be exact whatever the order.
  std::vector<float> a(20);
  for (int i = 0; i < 20; ++i) a[size_t(i)] = float(i + 1);
  CHECK(dot(a.data(), a.data(), 20) == 2870.0f);
  CHECK(sum(a.data(), 20) == 210.0f);
  CHECK(dot(a.data(), a.data(), 0) == 0.0f);
  CHECK(sum(a.data(), 3) == 6.0f);
}

TEST_CASE("dot agrees with its scalar twin for lengths 0..2N and misaligned starts", "[ops]") {
  // gemma.cpp's sweep: every length up to twice the unroll, every start offset within it.
  Rng rng(11);
  std::vector<double> a(64), b(64);
  for (size_t i = 0; i < 64; ++i) a[i] = rng.normal(), b[i] = rng.normal();
  for (int64_t off = 0; off < 8; ++off)
    for (int64_t n = 0; n <= 16 + 1; ++n) {
      CAPTURE(off, n);
      const long double twin = dot_twin(a.data() + off, b.data() + off, n);
      long double mag = 0;
      for (int64_t i = 0; i < n; ++i) mag += std::fabs(a[size_t(off + i)] * b[size_t(off + i)]);
      // Standard bound for any summation order: |error| <= n u sum|a_i b_i|, u = 2^-53.
      CHECK(std::fabs((long double)dot(a.data() + off, b.data() + off, n) - twin) <= (long double)n * 0x1p-53L * mag);
    }
}

TEST_CASE("linear uses torch's (out / in) weight layout", "[ops]") {
  // W = [[1, 2], [3, 4], [5, 6]] (OC=3, C=2), x = [[1, 1], [2, -1]], b = [10, 20, 30]
  // x W^T = [[3, 7, 11], [0, 2, 4]]
  const std::vector<double> W{1, 2, 3, 4, 5, 6}, x{1, 1, 2, -1}, b{10, 20, 30};
  std::vector<double> y(6);
  linear_forward(y.data(), x.data(), W.data(), b.data(), 2, 2, 3);
  CHECK(y == std::vector<double>{13, 27, 41, 10, 22, 34});
  linear_forward(y.data(), x.data(), W.data(), static_cast<const double*>(nullptr), 2, 2, 3);
  CHECK(y == std::vector<double>{3, 7, 11, 0, 2, 4});
}

TEST_CASE("softmax: a worked answer / rows that sum to one / the max subtracted", "[ops]") {
  // Both paths: the fast one (vmath's softmax_rows) and the reference loops.
  const CorePath path = GENERATE(CorePath::Fast, CorePath::Reference);
  CAPTURE(path == CorePath::Fast ? "fast" : "reference");
  const ScopedCorePath scoped(path);
  // softmax(log 1, log 2, log 3, log 4) = (1, 2, 3, 4) / 10
  std::vector<double> x{0.0, std::log(2.0), std::log(3.0), std::log(4.0)};
  softmax_forward(x.data(), x.data(), 1, 4);
  for (int i = 0; i < 4; ++i) CHECK(x[size_t(i)] == Approx((i + 1) / 10.0).epsilon(1e-15));

  // Without the max subtracted, exp(1000) overflows; with it these rows are (1/(1+e), e/(1+e)).
  std::vector<float> big{1000.f, 1001.f, -1000.f, -1001.f};
  softmax_forward(big.data(), big.data(), 2, 2);
  const double e = std::exp(1.0);
  CHECK(big[0] == Approx(1 / (1 + e)).epsilon(1e-6));
  CHECK(big[1] == Approx(e / (1 + e)).epsilon(1e-6));
  CHECK(big[2] == Approx(e / (1 + e)).epsilon(1e-6));
  CHECK(big[3] == Approx(1 / (1 + e)).epsilon(1e-6));

  Rng rng(3);
  std::vector<float> r(7 * 33);
  for (float& v : r) v = float(4 * rng.normal());
  softmax_forward(r.data(), r.data(), 7, 33);
  for (int row = 0; row < 7; ++row) {
    double s = 0;
    for (int c = 0; c < 33; ++c) {
      CHECK(r[size_t(row * 33 + c)] >= 0.f);
      s += r[size_t(row * 33 + c)];
    }
    CHECK(s == Approx(1.0).epsilon(33 * 0x1p-24));
  }
}

TEST_CASE("softmax: -inf entries get exactly zero weight / an all -inf row is NaN as in torch", "[ops]") {
  const CorePath path = GENERATE(CorePath::Fast, CorePath::Reference);
  CAPTURE(path == CorePath::Fast ? "fast" : "reference");
  const ScopedCorePath scoped(path);
  std::vector<double> x{1.0, -kInf, 2.0, -kInf, -kInf, -kInf};
  softmax_forward(x.data(), x.data(), 2, 3);
  CHECK(x[1] == 0.0);
  CHECK(x[0] + x[2] == Approx(1.0));
  for (int c = 3; c < 6; ++c) CHECK(std::isnan(x[size_t(c)]));
}

TEST_CASE("layer norm: biased variance / eps inside the root / affine", "[ops]") {
  // x = (1, 2, 3, 4): mean 2.5, biased variance 1.25 (the unbiased one would be 5/3).
  const std::vector<double> x{1, 2, 3, 4}, w{1, 2, 1, 1}, b{0, 0, 1, 0};
  std::vector<double> y(4);
  const double eps = 1e-5, r = 1 / std::sqrt(1.25 + eps);
  layernorm_forward(y.data(), x.data(), static_cast<const double*>(nullptr), static_cast<const double*>(nullptr), eps,
                    1, 4);
  CHECK(y[0] == Approx(-1.5 * r).epsilon(1e-15));
  CHECK(y[3] == Approx(1.5 * r).epsilon(1e-15));
  layernorm_forward(y.data(), x.data(), w.data(), b.data(), eps, 1, 4);
  CHECK(y[1] == Approx(2 * -0.5 * r).epsilon(1e-15));
  CHECK(y[2] == Approx(0.5 * r + 1).epsilon(1e-15));
}

TEST_CASE("layer norm keeps its digits on a row of tiny variance around a large mean", "[ops]") {
  // 1000 + (-1, 1) * 2^-10 in float: a one-pass E[x^2] - E[x]^2 would cancel to garbage; two
  // passes give exactly (-1, 1) / sqrt(1 + eps / var).
  std::vector<float> x{1000.f - 0x1p-10f, 1000.f + 0x1p-10f}, y(2);
  layernorm_forward(y.data(), x.data(), static_cast<const float*>(nullptr), static_cast<const float*>(nullptr), 0.f, 1,
                    2);
  CHECK(y[0] == Approx(-1.0).epsilon(1e-6));
  CHECK(y[1] == Approx(1.0).epsilon(1e-6));
}

TEST_CASE("relu and the erf form of gelu", "[ops]") {
  std::vector<double> x{-2, -0.5, 0, 0.5, 2}, y(5);
  relu_forward(y.data(), x.data(), 5);
  CHECK(y == std::vector<double>{0, 0, 0, 0.5, 2});
  // gelu(x) = x Phi(x); Phi(1) = 0.841344746068542948585, Phi(-1) = 0.158655253931457051415 (tables).
  std::vector<double> g{1, -1, 0}, out(3);
  gelu_forward(out.data(), g.data(), 3);
  CHECK(out[0] == Approx(0.841344746068542948585).epsilon(1e-15));
  CHECK(out[1] == Approx(-0.158655253931457051415).epsilon(1e-15));
  CHECK(out[2] == 0.0);
  // Not the tanh approximation, which gives 0.841191990607... at 1.
  CHECK(std::fabs(out[0] - 0.8411919906082768) > 1e-4);
}
