# AddressSanitizer and UndefinedBehaviorSanitizer for the project's own targets: with
# -DTPARITY_SANITIZE=ON every target defined after this include (the libraries, the CLI, the test
# executables) is compiled and linked with them. The dependencies (LibTorch, fmt, the C++ runtime)
# are Debian's prebuilt libraries and stay uninstrumented. Any UBSan report is fatal
# (-fno-sanitize-recover), so a report fails the test that made it. scripts/sanitize builds this in
# build-asan and runs the suite under the ASAN_OPTIONS/UBSAN_OPTIONS it sets.
option(TPARITY_SANITIZE "Build the project's own targets with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)

# -g1: line tables, so that a report names file and line, at a fraction of -g's build time.
set(TPARITY_SANITIZER_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g1)
set(TPARITY_SANITIZER_LINK_FLAGS -fsanitize=address,undefined)

if(TPARITY_SANITIZE)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "^(GNU|Clang)$")
    message(FATAL_ERROR "TPARITY_SANITIZE needs GCC or Clang, got ${CMAKE_CXX_COMPILER_ID}")
  endif()
  add_compile_options(${TPARITY_SANITIZER_FLAGS})
  add_link_options(${TPARITY_SANITIZER_LINK_FLAGS})
endif()
