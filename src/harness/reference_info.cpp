#include "tparity/harness/reference_info.hpp"

namespace tparity {

std::string ReferenceInfo::line() const {
  if (torch == "none") return "no LibTorch (built with -DTPARITY_TORCH=off)";
  std::string s = "LibTorch " + torch + (source.empty() ? "" : " (" + source + ")");
  if (!blas.empty()) s += ": " + blas;
  if (!kernel.empty()) s += "; " + kernel;
  if (!capability.empty()) s += "; ATen " + capability;
  s += "; " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  for (size_t i = 0; i < pinned.size(); ++i) s += (i ? ", " : "; pinned by ") + pinned[i];
  return s;
}

std::string ReferenceInfo::short_name() const {
  if (torch == "none") return "none";
  std::string lib = blas.substr(0, blas.find(' '));
  if (!lib.empty() && lib.back() == ',') lib.pop_back();
  return torch + "/" + lib + "/" + capability;
}

}  // namespace tparity
