// The reference runner when tparity is built with -DTPARITY_WITH_TORCH=OFF.
#include <stdexcept>

#include "tparity/torch/reference.hpp"

namespace tparity {

bool torch_available() { return false; }
std::string torch_version() { return "none"; }
std::string torch_blas() { return "none"; }
int torch_threads() { return 0; }
std::string module_limitation(const Problem&) {
  return "tparity was built without LibTorch (-DTPARITY_WITH_TORCH=OFF)";
}
std::function<void()> prepare_torch(const Problem&, DType, const std::string& where, bool) {
  throw std::runtime_error(where + ": tparity was built without LibTorch (-DTPARITY_WITH_TORCH=OFF)");
}
void set_torch_threads(int) {}
TorchRun run_torch(const Problem&, DType, bool, const std::string& where) {
  throw std::runtime_error(where + ": tparity was built without LibTorch (-DTPARITY_WITH_TORCH=OFF)");
}

}  // namespace tparity
