// gemv_forward's switches for the tests (the function itself: llm.hpp).
#pragma once

namespace tparity::gemv_detail {

// The weight rows the AVX-512 float kernel takes per step: 0 (the default) by the CPU's vendor (8,
// each prefetched 256 floats ahead, on Intel; 4 without a prefetch elsewhere), or 4 or 8 forced, so
// that the tests hold both to the same bits on any machine. Throws std::invalid_argument otherwise.
void set_rows_per_step(int rows);

}  // namespace tparity::gemv_detail
