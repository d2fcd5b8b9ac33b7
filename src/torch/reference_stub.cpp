// The reference runner when tparity is built with -DTPARITY_TORCH=off.
#include <stdexcept>

#include "tparity/torch/reference.hpp"

namespace tparity {

bool torch_available() { return false; }
std::string torch_version() { return "none"; }
std::string torch_blas() { return "none"; }
ReferenceInfo reference_info() { return {}; }
TorchSemantics reference_semantics() { return TorchSemantics::Torch2; }
int torch_threads() { return 0; }
std::string low_precision_limitation(DType) { return "tparity was built without LibTorch (-DTPARITY_TORCH=off)"; }
std::string module_limitation(const Problem&) { return "tparity was built without LibTorch (-DTPARITY_TORCH=off)"; }
std::function<void()> prepare_torch(const Problem&, DType, const std::string& where, bool) {
  throw std::runtime_error(where + ": tparity was built without LibTorch (-DTPARITY_TORCH=off)");
}
void set_torch_threads(int) {}
TorchRun run_torch(const Problem&, DType, bool, const std::string& where) {
  throw std::runtime_error(where + ": tparity was built without LibTorch (-DTPARITY_TORCH=off)");
}

}  // namespace tparity
