// Which LibTorch this is, and what it computes with on this CPU: its BLAS (MKL and oneDNN in the
// PyTorch wheel; the system's libblas.so.3, OpenBLAS, in Debian's build), the code path the BLAS
// chose, ATen's CPU capability, threads, and the environment variables that pin any of them.
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <dlfcn.h>

#include <cstdlib>
#include <fstream>
#include <regex>

#include "common.hpp"

namespace tparity {

namespace {

// The first match of `re`'s group 1 in `s`, or "".
std::string grab(const std::string& s, const char* re) {
  std::smatch m;
  return std::regex_search(s, m, std::regex(re)) ? m[1].str() : "";
}

// The shared object the loader mapped whose path holds `name`, from /proc/self/maps.
std::string mapped(const char* name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto pos = line.find('/');
    if (pos != std::string::npos && line.find(name, pos) != std::string::npos) return line.substr(pos);
  }
  return "";
}

template <class F>
F symbol(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

// MKL's conditional-numerical-reproducibility branches (mkl_cbwr.h): the code path it runs.
std::string mkl_branch(int b) {
  switch (b) {
    case 3:
      return "COMPATIBLE";
    case 4:
      return "SSE2";
    case 6:
      return "SSSE3";
    case 7:
      return "SSE4.1";
    case 8:
      return "SSE4.2";
    case 9:
      return "AVX";
    case 10:
      return "AVX2";
    case 11:
      return "AVX-512 (MIC)";
    case 12:
      return "AVX-512";
    case 13:
      return "AVX-512 (MIC E1)";
    case 14:
      return "AVX-512 (E1)";
  }
  return "branch " + std::to_string(b);
}

// OpenBLAS kernels written before AVX2: on a CPU with AVX2 they mean OpenBLAS did not recognise it
// (0.3.21 on an Emerald Rapids Xeon falls back to Prescott) or was told to use them.
bool pre_avx2_core(const std::string& core) {
  static const std::regex old(
      "^(prescott|katmai|coppermine|northwood|core2|penryn|dunnington|nehalem|atom|"
      "opteron|barcelona|bobcat|bulldozer|piledriver|sandybridge|generic)",
      std::regex::icase);
  return std::regex_search(core, old);
}

}  // namespace

ReferenceInfo reference_info() {
  static const ReferenceInfo info = [] {
    ReferenceInfo r;
    r.torch = torch_version();
#ifdef TPARITY_TORCH_SOURCE
    r.source = TPARITY_TORCH_SOURCE;
#endif
    // A product first, so that a lazily loaded BLAS is mapped.
    (void)at::mm(at::ones({2, 2}), at::ones({2, 2}));
    const std::string config = at::show_config();
    const std::string mkl = grab(at::get_mkl_version(), R"(Version ([0-9.]+))");
    const std::string dnnl = grab(at::get_mkldnn_version(), R"(v([0-9.]+))");
    if (!mkl.empty()) {
      r.blas = "MKL " + mkl + (dnnl.empty() ? "" : ", oneDNN " + dnnl);
      // MKL exports no official way to ask; its internal service functions say what they can.
      auto branch = symbol<int (*)()>("mkl_serv_cbwr_get_auto_branch");
      auto intel = symbol<int (*)()>("mkl_serv_intel_cpu_true");
      const int b = branch ? branch() : 2;
      r.kernel = b > 2 ? "MKL branch " + mkl_branch(b)
                       : std::string("MKL auto branch") +
                             (intel && !intel() ? " (a non-Intel CPU: MKL picks its own path)" : "");
    } else if (auto corename = symbol<char* (*)()>("openblas_get_corename")) {
      auto cfg = symbol<char* (*)()>("openblas_get_config");
      const std::string version = cfg ? grab(cfg(), R"(OpenBLAS ([0-9.]+))") : "";
      r.blas = "OpenBLAS" + (version.empty() ? "" : " " + version);
      const std::string core = corename();
      r.kernel = "OpenBLAS core " + core;
      r.generic_kernel = pre_avx2_core(core) && __builtin_cpu_supports("avx2");
      if (r.generic_kernel && !std::getenv("OPENBLAS_CORETYPE"))
        r.warning = "OpenBLAS runs its generic " + core +
                    " kernels on this AVX2 CPU (it does not recognise the model): LibTorch's float32 products are "
                    "slower and round in yet another order";
    } else {
      std::string lib = mapped("libblas");
      r.blas = lib.empty() ? grab(config, R"(BLAS_INFO=([a-z_]+))") : lib.substr(lib.rfind('/') + 1);
    }
#if TORCH_VERSION_MAJOR >= 2
    r.capability = at::get_cpu_capability();
#else
    r.capability = grab(config, R"(CPU capability usage: ([A-Z0-9_]+))");  // 1.13 exports no function for it
#endif
    // Only what this reference's libraries read: an OPENBLAS_* variable the environment holds (some
    // machines set OPENBLAS_CORETYPE for every program) pins nothing of MKL's, and the reverse.
    std::vector<const char*> read{"ATEN_CPU_CAPABILITY"};
    if (!mkl.empty()) read.insert(read.end(), {"MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_DEBUG_CPU_TYPE"});
    if (!dnnl.empty()) read.insert(read.end(), {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"});
    if (r.blas.rfind("OpenBLAS", 0) == 0) read.insert(read.end(), {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"});
    for (const char* v : read)
      if (const char* val = std::getenv(v); val && *val) r.pinned.push_back(std::string(v) + "=" + val);
    return r;
  }();
  ReferenceInfo r = info;
  r.threads = at::get_num_threads();
  return r;
}

std::string torch_blas() { return reference_info().blas; }

}  // namespace tparity
