# SPDX-License-Identifier: Apache-2.0
# What `cmake --install` puts under the prefix, for projects that embed strata:
#   include/strata/<folder>/...    the public headers (only those an embedder
#                                  includes, and what they include)
#   lib/libstrata_<folder>.a       the folder libraries
#   lib/libstrata.so*              the C API (base/c_api.h, tiers/c_api.h, optim/c_api.h)
#   lib/cmake/strata/              the CMake package: find_package(strata) gives
#                                  strata::base, strata::tiers, strata::swap,
#                                  strata::kernels, strata::models, strata::optim, strata::engine
#                                  (each library folder's, named after it) and
#                                  strata::c (libstrata.so)
# An embedder includes <strata/tiers/tier_store.h>; the headers include each
# other as "base/status.h", so both include/ and include/strata/ are on the
# targets' include path. examples/find_package/ is such a project, built and
# run against an installed tree by CTest (examples.find_package).
#
# A folder's CMakeLists.txt calls strata_install(<target> HEADERS ...) once;
# the top-level one calls strata_install_package() after all folders.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(STRATA_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/strata)
set(STRATA_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/strata)

# The include directories of a strata target: the source tree in the build,
# the prefix's include/ and include/strata/ once installed.
function(strata_target_includes target scope)
  target_include_directories(${target} ${scope}
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    $<INSTALL_INTERFACE:${STRATA_INSTALL_INCLUDEDIR}>)
endfunction()

# strata_install(<target> [HEADERS <header>...]): installs the library into the
# export set as strata::<target without "strata_"> and the listed headers
# (paths relative to the calling folder) under include/strata/<folder>/.
function(strata_install target)
  cmake_parse_arguments(A "" "" "HEADERS" ${ARGN})
  string(REGEX REPLACE "^strata_" "" export_name ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
  install(TARGETS ${target} EXPORT strataTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  file(RELATIVE_PATH folder ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  foreach(header IN LISTS A_HEADERS)
    if(NOT EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${header})
      message(FATAL_ERROR "strata_install(${target}): header ${folder}/${header} does not exist")
    endif()
    get_filename_component(subdir ${header} DIRECTORY)
    install(FILES ${header} DESTINATION ${STRATA_INSTALL_INCLUDEDIR}/${folder}/${subdir})
  endforeach()
endfunction()

# The export set and the package files (strataConfig.cmake finds the
# dependencies the exported targets name: cmake/strataConfig.cmake.in).
function(strata_install_package)
  install(EXPORT strataTargets NAMESPACE strata:: DESTINATION ${STRATA_INSTALL_CMAKEDIR})
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/strataConfig.cmake.in
    ${PROJECT_BINARY_DIR}/strataConfig.cmake
    INSTALL_DESTINATION ${STRATA_INSTALL_CMAKEDIR})
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/strataConfig.cmake ${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
    DESTINATION ${STRATA_INSTALL_CMAKEDIR})
endfunction()
