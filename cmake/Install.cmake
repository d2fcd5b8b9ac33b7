# cmake --install: headers, the libraries, the CLI, the committed fixtures and a CMake package, so
# that another project's find_package(tparity) gives it tparity::tparity (everything), or the layers
# one by one: tparity::core (the handwritten core alone, no torch), tparity::harness,
# tparity::fixture, tparity::compare, tparity::reference (LibTorch), tparity::eval.
include(CMakePackageConfigHelpers)

set(_tparity_layers core harness fixture compare torch eval)
foreach(layer IN LISTS _tparity_layers)
  set(_export ${layer})
  if(layer STREQUAL "torch")
    set(_export reference)
  endif()
  set_target_properties(tparity_${layer} PROPERTIES EXPORT_NAME ${_export})
  add_library(tparity::${_export} ALIAS tparity_${layer})
endforeach()
add_library(tparity_all INTERFACE)
target_link_libraries(tparity_all INTERFACE tparity_eval tparity_torch)
set_target_properties(tparity_all PROPERTIES EXPORT_NAME tparity)
add_library(tparity::tparity ALIAS tparity_all)

install(TARGETS tparity_core tparity_harness tparity_fixture tparity_compare tparity_torch tparity_eval tparity_all
        EXPORT tparityTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS tparity RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The CLI's LibTorch reference, which it loads on first use from <bindir>/../<libdir>/tparity
# (src/torch/loader.cpp). It runs against the LibTorch it was built with, wherever that lies: with a
# torch wheel and Debian's libtorch-dev on one machine, a module without this RUNPATH loads the
# system's libtorch.so (1.13) and dies on a missing symbol.
if(TPARITY_WITH_TORCH)
  if(TPARITY_TORCH_LIBDIR)
    set_target_properties(tparity_reference PROPERTIES INSTALL_RPATH "${TPARITY_TORCH_LIBDIR}")
  endif()
  install(TARGETS tparity_reference LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/tparity)
endif()
install(DIRECTORY include/tparity DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY fixtures/ DESTINATION ${CMAKE_INSTALL_DATADIR}/tparity/fixtures FILES_MATCHING PATTERN "*.json")

set(_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/tparity)
install(EXPORT tparityTargets NAMESPACE tparity:: DESTINATION ${_cmakedir})
configure_package_config_file(cmake/tparityConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/tparityConfig.cmake
                              INSTALL_DESTINATION ${_cmakedir}
                              PATH_VARS CMAKE_INSTALL_DATADIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/tparityConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tparityConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/tparityConfigVersion.cmake
        DESTINATION ${_cmakedir})
