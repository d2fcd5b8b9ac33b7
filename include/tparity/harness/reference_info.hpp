// Which PyTorch judged: the LibTorch a verdict was reached against, its BLAS and the kernels it ran on
// this CPU. Every report (table, JSON, JUnit), baseline, fixture and bench row names it, because a
// float32 verdict depends on all of them (README, "Which PyTorch judged").
#pragma once

#include <string>
#include <vector>

namespace tparity {

struct ReferenceInfo {
  std::string torch = "none";       // LibTorch's version, e.g. "2.13.0"; "none" when built without it
  std::string source;               // how tparity was built against it: "wheel", "debian", "prefix"
  std::string blas;                 // e.g. "MKL 2024.2, oneDNN 3.12.0" or "OpenBLAS 0.3.21"
  std::string kernel;               // the BLAS's code path on this CPU, e.g. "MKL branch AVX-512", "OpenBLAS core Zen"
  std::string capability;           // ATen's own kernels' instruction set: "AVX512", "AVX2", "DEFAULT"
  std::vector<std::string> pinned;  // the environment that chose kernels, as set: "OPENBLAS_CORETYPE=Haswell"
  int threads = 0;                  // LibTorch's intra-op threads
  std::string warning;              // non-empty when the BLAS fell back to a generic kernel on this CPU
  bool generic_kernel = false;      // OpenBLAS runs pre-AVX2 kernels on this AVX2 CPU, asked to or not

  // One line: "LibTorch 2.13.0 (wheel): MKL 2024.2, oneDNN 3.12.0; MKL branch AVX-512; ATen AVX512; 1 thread".
  std::string line() const;
  // Short form for a column or a key: "2.13.0/MKL/AVX512".
  std::string short_name() const;
};

}  // namespace tparity
