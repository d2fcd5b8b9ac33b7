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

# tparity_sanitize_at_o0(TARGET [EXCEPT REGEX]): under the sanitizers, the target compiles at -O0
# instead of the tree's level (scripts/sanitize: -O2), but its sources matching REGEX, which keep the
# tree's level. For code that does little arithmetic, the CLI's options and reports and the CLI tests'
# drivers, whose templates (CLI11, nlohmann::json, fmt, Catch2) make most of the tree's compile time:
# clang-14 with ASan + UBSan takes about 29 s for cmd_census.cpp at -O2 and 9 s at -O0. The torch-free
# tree builds in about 650 CPU seconds instead of 900, its suite as fast (64 s on two cores either
# way). Libraries, unit tests and the bench's timing loops (bench/measure.cpp's FMA peak and
# bandwidth, bench/gemm.cpp's operands) keep the tree's level (Catch2's runner, which the unit tests
# share, only drives them): the hand core's arithmetic, the readers the fuzzers drive and the peak
# loops are where the time of a run goes (the bench's --gemm test took 12 minutes with all of the CLI
# at -O0). -O0 is the target's option, not each source's, so that a unity build (the CLI's) still
# batches its files; a source with an option of its own is compiled apart.
function(tparity_sanitize_at_o0 target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "EXCEPT" "")
  if(NOT TPARITY_SANITIZE)
    return()
  endif()
  target_compile_options(${target} PRIVATE -O0)
  if(NOT arg_EXCEPT)
    return()
  endif()
  # The tree's level: the last -O of its flags (a single-configuration generator, as the scripts use).
  string(TOUPPER "${CMAKE_BUILD_TYPE}" config)
  string(REGEX MATCHALL "-O[0-9sgz]?" levels "${CMAKE_CXX_FLAGS} ${CMAKE_CXX_FLAGS_${config}}")
  list(POP_BACK levels level)  # the last one given is the one the compiler takes
  if(NOT level)
    set(level -O0)
  endif()
  get_target_property(sources ${target} SOURCES)
  foreach(source ${sources})
    if(source MATCHES "^\\$<")  # another target's objects ($<TARGET_OBJECTS:...>)
      continue()
    endif()
    if(source MATCHES "${arg_EXCEPT}")
      set_property(SOURCE ${source} APPEND PROPERTY COMPILE_OPTIONS ${level})
    endif()
  endforeach()
endfunction()
