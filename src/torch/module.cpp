// The entry point of libtparity_reference.so (module.hpp): the reference's API as a table. Linked with
// -Bsymbolic-functions, so that the addresses below are this module's functions, never the
// executable's forwarding functions of the same names (loader.cpp).
#include "module.hpp"

namespace tparity::reference_module {
namespace {

const Table kTable{sizeof(Table),         kAbi,
                   &torch_version,        &torch_blas,
                   &torch_threads,        &reference_info,
                   &reference_semantics,  &low_precision_limitation,
                   &module_limitation,    &prepare_torch,
                   &set_torch_threads,    &run_torch};

}  // namespace
}  // namespace tparity::reference_module

extern "C" __attribute__((visibility("default"))) const tparity::reference_module::Table* tparity_reference_table() {
  return &tparity::reference_module::kTable;
}
