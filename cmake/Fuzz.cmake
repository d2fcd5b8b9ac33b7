# The libFuzzer target over the fixture reader (tests/fuzz): with -DTPARITY_FUZZ=ON (Clang only)
# every target defined after this include is compiled with libFuzzer's coverage instrumentation and
# with ASan + UBSan as cmake/Sanitizers.cmake sets them, and tests/fuzz/CMakeLists.txt adds
# tparity_fuzz_fixture, linked with libFuzzer's driver. The fixture reader needs no LibTorch:
# scripts/fuzz configures build-fuzz with clang++-14, -DTPARITY_WITH_TORCH=OFF and
# -DTPARITY_BUILD_TESTS=OFF.
option(TPARITY_FUZZ "Build the libFuzzer target over the fixture reader, tparity_fuzz_fixture (Clang)" OFF)

if(TPARITY_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "TPARITY_FUZZ needs Clang with libFuzzer (clang++-14, libclang-rt-14-dev), "
                        "got ${CMAKE_CXX_COMPILER_ID}: configure with -DCMAKE_CXX_COMPILER=clang++-14")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
  if(NOT TPARITY_SANITIZE)
    add_compile_options(${TPARITY_SANITIZER_FLAGS})
    add_link_options(${TPARITY_SANITIZER_LINK_FLAGS})
  endif()
endif()
