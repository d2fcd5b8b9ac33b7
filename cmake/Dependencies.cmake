# Every third-party dependency is a Debian package, found once here.
#   fmt           libfmt-dev           formatting of tables and messages
#   nlohmann_json nlohmann-json3-dev   fixtures and JSON reports
#   CLI11         libcli11-dev         the command line
#   Catch2 (v2)   catch2               the test suite
#   Torch         libtorch-dev         the reference runner (LibTorch 1.13), only with TPARITY_WITH_TORCH
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
if(TPARITY_BUILD_TESTS)
  find_package(Catch2 2 REQUIRED)
endif()
if(TPARITY_WITH_TORCH)
  find_package(Torch REQUIRED)
  # TorchConfig appends its flags to CMAKE_CXX_FLAGS; keep them but not the ABI surprises.
endif()
