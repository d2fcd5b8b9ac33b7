// The LibTorch reference as a module of its own (libtparity_reference.so), which the tparity
// executable loads the first time it needs the reference (loader.cpp): starting LibTorch costs 0.25 s
// (2.13) to 0.5 s (1.13) of static operator registration, and a refusal or a hand-core-only command
// needs none of it. The module holds src/torch/*.cpp and exports one function, which hands
// out the reference's API (tparity/torch/reference.hpp) as this table; the code it calls (the
// harness, the core) is the executable's own, exported to it. Torch-free: the loader includes it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "tparity/torch/reference.hpp"

namespace tparity::reference_module {

// reference.hpp's functions, one pointer each (torch_available is the loader's: true).
struct Table {
  std::size_t size;  // sizeof(Table) where the module was compiled
  const char* abi;   // kAbi where the module was compiled
  std::string (*torch_version)();
  std::string (*torch_blas)();
  int (*torch_threads)();
  ReferenceInfo (*reference_info)();
  TorchSemantics (*reference_semantics)();
  std::string (*low_precision_limitation)(DType);
  std::string (*module_limitation)(const Problem&);
  std::function<void()> (*prepare_torch)(const Problem&, DType, const std::string&, bool);
  void (*set_torch_threads)(int);
  TorchRun (*run_torch)(const Problem&, DType, bool, const std::string&);
};

// What executable and module must agree on to share C++ objects: tparity's version, the configuration
// that built them (an identifier drawn at each configure: CMakeLists.txt) and the compiler's version.
inline constexpr const char* kAbi = "tparity " TPARITY_VERSION " build " TPARITY_BUILD_ID "; " __VERSION__;

// The module's one export, looked up by this name.
inline constexpr const char* kEntry = "tparity_reference_table";

}  // namespace tparity::reference_module
