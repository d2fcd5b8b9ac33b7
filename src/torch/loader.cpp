// The reference's API (tparity/torch/reference.hpp) in the tparity executable: LibTorch lives in
// libtparity_reference.so (module.hpp), loaded the first time a function here needs it. Until then
// tparity has not started LibTorch: a refusal or a command that runs the hand core alone costs no
// LibTorch start-up (0.25 s with 2.13, 0.5 s with Debian's 1.13, per process).
//
// Where the module is: beside the executable (the build tree), else where `cmake --install` puts it
// relative to the executable's directory (TPARITY_REFERENCE_FROM_BIN, e.g. ../lib/tparity/...). The
// executable's own path is the kernel's (/proc/self/exe), never the environment's or the caller's.
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "module.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity {
namespace {

using reference_module::Table;

struct Loader {
  std::mutex mutex;
  const Table* table = nullptr;
  std::optional<int> threads;  // set_torch_threads before the module was loaded: applied on loading
};

Loader& loader() {
  static Loader l;
  return l;
}

std::string executable_dir() {
  std::vector<char> buf(4096);
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0)
    throw std::runtime_error(std::string("cannot find tparity's own path (/proc/self/exe): ") + std::strerror(errno));
  const std::string exe(buf.data(), static_cast<size_t>(n));
  return exe.substr(0, exe.rfind('/'));
}

bool regular_file(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

const Table& load(Loader& l) {
  const std::string dir = executable_dir();
  const std::vector<std::string> candidates{dir + "/" TPARITY_REFERENCE_MODULE, dir + "/" TPARITY_REFERENCE_FROM_BIN};
  std::string path;
  for (const std::string& c : candidates)
    if (regular_file(c)) {
      path = c;
      break;
    }
  if (path.empty())
    throw std::runtime_error("the LibTorch reference " TPARITY_REFERENCE_MODULE " is neither beside tparity (" + dir +
                             ") nor at " + candidates[1] + ": run tparity from where it was built or installed");
  // RTLD_GLOBAL: LibTorch's libraries and their BLAS visible to the whole process, as when LibTorch was
  // linked in (the reference finds OpenBLAS's thread count and MKL's code path by name).
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!handle) throw std::runtime_error("the LibTorch reference " + path + " did not load: " + dlerror());
  using Entry = const Table* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, reference_module::kEntry));
  const Table* t = entry ? entry() : nullptr;
  if (!t || t->size != sizeof(Table) || std::strcmp(t->abi, reference_module::kAbi) != 0)
    throw std::runtime_error("the LibTorch reference " + path + " is not this tparity's (built by " +
                             (t ? std::string(t->abi) : std::string("another program")) + ", tparity is " +
                             reference_module::kAbi + "): build and install both together");
  if (l.threads) t->set_torch_threads(*l.threads);
  l.table = t;
  return *t;
}

const Table& reference() {
  Loader& l = loader();
  std::lock_guard<std::mutex> lock(l.mutex);
  return l.table ? *l.table : load(l);
}

}  // namespace

bool torch_available() { return true; }
std::string torch_version() { return reference().torch_version(); }
std::string torch_blas() { return reference().torch_blas(); }
int torch_threads() { return reference().torch_threads(); }
ReferenceInfo reference_info() { return reference().reference_info(); }
TorchSemantics reference_semantics() { return reference().reference_semantics(); }
std::string low_precision_limitation(DType dtype) { return reference().low_precision_limitation(dtype); }
std::string module_limitation(const Problem& p) { return reference().module_limitation(p); }
std::function<void()> prepare_torch(const Problem& p, DType dtype, const std::string& where, bool run_once) {
  return reference().prepare_torch(p, dtype, where, run_once);
}
TorchRun run_torch(const Problem& p, DType dtype, bool collect_components, const std::string& where) {
  return reference().run_torch(p, dtype, collect_components, where);
}

void set_torch_threads(int n) {
  Loader& l = loader();
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    if (!l.table) {
      l.threads = n;
      return;
    }
  }
  l.table->set_torch_threads(n);
}

}  // namespace tparity
