# Every third-party dependency is found once here.
#   fmt           libfmt-dev           formatting of tables and messages
#   nlohmann_json nlohmann-json3-dev   fixtures and JSON reports
#   CLI11         libcli11-dev         the command line
#   Catch2 (v2)   catch2               the test suite
#   Torch         the reference runner, as TPARITY_TORCH chooses:
#     wheel   (default) the LibTorch inside the torch wheel of TPARITY_PYTHON's environment: the project's
#             .venv, which scripts/lib.sh installs from requirements.txt (torch==2.13.0, MKL and oneDNN)
#     debian  Debian's libtorch-dev (LibTorch 1.13.1 on the system BLAS, OpenBLAS)
#     off     no reference: the core, harness, fixture and comparator libraries and their tests
#   A Torch_DIR given on the command line wins over both (any LibTorch install); so does a
#   CMAKE_PREFIX_PATH holding one, with TPARITY_TORCH=prefix.
#   -DTPARITY_WITH_TORCH=OFF, the older spelling, still means TPARITY_TORCH=off.
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
if(TPARITY_BUILD_TESTS)
  find_package(Catch2 2 REQUIRED)
endif()

set(TPARITY_TORCH "wheel" CACHE STRING "The LibTorch reference: wheel (torch in TPARITY_PYTHON's environment), debian (libtorch-dev 1.13), prefix (CMAKE_PREFIX_PATH or Torch_DIR), off")
set_property(CACHE TPARITY_TORCH PROPERTY STRINGS wheel debian prefix off)
set(TPARITY_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
    "The Python whose torch wheel carries the LibTorch of TPARITY_TORCH=wheel")
if(DEFINED TPARITY_WITH_TORCH AND NOT TPARITY_WITH_TORCH)
  set(TPARITY_TORCH off CACHE STRING "" FORCE)
endif()
if(NOT TPARITY_TORCH MATCHES "^(wheel|debian|prefix|off)$")
  message(FATAL_ERROR "TPARITY_TORCH: expected wheel, debian, prefix or off, got \"${TPARITY_TORCH}\"")
endif()
if(TPARITY_TORCH STREQUAL "off")
  set(TPARITY_WITH_TORCH OFF)
else()
  set(TPARITY_WITH_TORCH ON)
endif()

if(TPARITY_WITH_TORCH)
  if(Torch_DIR)
    # Given on the command line: that LibTorch, whatever TPARITY_TORCH says.
    set(_torch_hint "${Torch_DIR}")
  elseif(TPARITY_TORCH STREQUAL "wheel")
    if(NOT EXISTS "${TPARITY_PYTHON}")
      message(FATAL_ERROR "TPARITY_TORCH=wheel: no Python at TPARITY_PYTHON=${TPARITY_PYTHON}. Create the project's "
                          "virtual environment (scripts/lib.sh does: python3 -m venv .venv && .venv/bin/pip install -r "
                          "requirements.txt), or point TPARITY_PYTHON at a Python with torch installed, or build "
                          "against Debian's LibTorch with -DTPARITY_TORCH=debian")
    endif()
    execute_process(COMMAND "${TPARITY_PYTHON}" -c "import torch, sys; sys.stdout.write(torch.utils.cmake_prefix_path)"
                    OUTPUT_VARIABLE _torch_prefix ERROR_VARIABLE _torch_err RESULT_VARIABLE _torch_rc)
    if(NOT _torch_rc EQUAL 0)
      message(FATAL_ERROR "TPARITY_TORCH=wheel: ${TPARITY_PYTHON} cannot import torch (${_torch_err}); install "
                          "requirements.txt into its environment")
    endif()
    set(_torch_hint "${_torch_prefix}/Torch")
    get_filename_component(_torch_libdir "${_torch_prefix}/../../lib" ABSOLUTE)
  elseif(TPARITY_TORCH STREQUAL "debian")
    set(_torch_hint "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/Torch")
    set(_torch_libdir "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}")
  endif()
  if(_torch_hint)
    # Only there: with both installed, nothing of the other may be picked up. TorchConfig's own
    # find_package(Caffe2 PATHS ...) and find_library(c10 / torch PATHS ...) search the system
    # directories first, and would take Debian's targets and libraries into a wheel build: point them
    # at the same install first.
    set(Caffe2_DIR "${_torch_hint}/../Caffe2" CACHE PATH "" FORCE)
    if(_torch_libdir)
      find_library(TORCH_LIBRARY torch PATHS "${_torch_libdir}" NO_DEFAULT_PATH)
      find_library(c10_LIBRARY c10 PATHS "${_torch_libdir}" NO_DEFAULT_PATH)
    endif()
    find_package(Torch REQUIRED CONFIG PATHS "${_torch_hint}" NO_DEFAULT_PATH)
  else()
    find_package(Torch REQUIRED CONFIG)
  endif()
  set(TPARITY_TORCH_DIR "${Torch_DIR}")
  get_filename_component(TPARITY_TORCH_LIBDIR "${TORCH_LIBRARY}" DIRECTORY)
  message(STATUS "tparity: LibTorch ${Torch_VERSION} from ${Torch_DIR} (TPARITY_TORCH=${TPARITY_TORCH})")
endif()
