# The libFuzzer targets (tests/fuzz): with -DTPARITY_FUZZ=ON (Clang only) tests/fuzz/CMakeLists.txt
# adds tparity_fuzz_fixture and tparity_fuzz_safetensors, linked with libFuzzer's driver, and
# tparity_fuzz_instrument(target) compiles a target with libFuzzer's coverage instrumentation: the
# fuzz targets and the libraries they link (the core, harness, fixture readers and comparator), no
# others. Every target is compiled with ASan + UBSan as cmake/Sanitizers.cmake sets them: by
# Sanitizers.cmake itself with -DTPARITY_SANITIZE=ON, here otherwise. Two trees build them, both
# without LibTorch: scripts/fuzz's own, build-fuzz (clang++-14, Release, -DTPARITY_BUILD_TESTS=OFF:
# the fuzz targets and their libraries alone), and scripts/sanitize's torch-free tree,
# build-asan-notorch (-O2 with assertions on), where the unit and CLI suites run on the same
# libraries: ./scripts/test fuzzes the targets built there instead of compiling the libraries again.
option(TPARITY_FUZZ "Build the libFuzzer targets tparity_fuzz_fixture and tparity_fuzz_safetensors (Clang)" OFF)

if(TPARITY_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "TPARITY_FUZZ needs Clang with libFuzzer (clang++-14, libclang-rt-14-dev), "
                        "got ${CMAKE_CXX_COMPILER_ID}: configure with -DCMAKE_CXX_COMPILER=clang++-14")
  endif()
  if(NOT TPARITY_SANITIZE)
    add_compile_options(${TPARITY_SANITIZER_FLAGS})
    add_link_options(${TPARITY_SANITIZER_LINK_FLAGS})
  endif()
endif()

# libFuzzer's coverage instrumentation for one target when TPARITY_FUZZ is on (nothing otherwise).
# Outside a fuzz target (the unit tests linking an instrumented library) the sanitizer runtime's
# empty hooks take the coverage callbacks.
function(tparity_fuzz_instrument target)
  if(TPARITY_FUZZ)
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer-no-link)
  endif()
endfunction()
