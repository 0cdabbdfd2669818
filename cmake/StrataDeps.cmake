# SPDX-License-Identifier: Apache-2.0
# Third-party dependencies, all from Debian's packages (see scripts/install-deps.sh).
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
find_package(TBB REQUIRED CONFIG)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
find_package(nlohmann_json 3.2 REQUIRED CONFIG)
find_package(Boost 1.71 REQUIRED COMPONENTS program_options CONFIG)
# The communicators of comm/, each optional (their factories say what is
# missing): MPI (Open MPI, Debian's libopenmpi-dev) for CPU-backend ranks;
# NCCL, which comes with the CUDA Toolkit here, for CUDA ranks.
find_package(MPI COMPONENTS C QUIET)
set(STRATA_WITH_MPI OFF)
if(MPI_C_FOUND)
  set(STRATA_WITH_MPI ON)
endif()
set(STRATA_WITH_NCCL OFF)
if(STRATA_WITH_CUDA)
  find_path(STRATA_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
  find_library(STRATA_NCCL_LIBRARY nccl
    HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR} ENV NCCL_HOME
    PATH_SUFFIXES lib lib64 targets/x86_64-linux/lib)
  if(STRATA_NCCL_INCLUDE_DIR AND STRATA_NCCL_LIBRARY)
    set(STRATA_WITH_NCCL ON)
  endif()
endif()
string(APPEND STRATA_CUDA_SUMMARY ", MPI ${STRATA_WITH_MPI}, NCCL ${STRATA_WITH_NCCL}")
if(STRATA_BUILD_TESTS)
  find_package(GTest REQUIRED CONFIG)
endif()
if(STRATA_BUILD_BENCH OR STRATA_BUILD_TESTS)
  find_package(benchmark REQUIRED CONFIG)
endif()

# Every strata library gets these.
function(strata_library name)
  cmake_parse_arguments(A "" "" "SOURCES;PUBLIC;PRIVATE" ${ARGN})
  if(NOT A_SOURCES)  # a folder with no code yet: headers and links only
    add_library(${name} INTERFACE)
    strata_target_includes(${name} INTERFACE)
    target_link_libraries(${name} INTERFACE ${A_PUBLIC})
    return()
  endif()
  add_library(${name} STATIC ${A_SOURCES})
  strata_target_includes(${name} PUBLIC)  # cmake/StrataInstall.cmake
  # (strata_warnings is the build's own: an installed static library names
  # its private links, and that one is not exported.)
  target_link_libraries(${name} PUBLIC ${A_PUBLIC} PRIVATE $<BUILD_INTERFACE:strata_warnings> ${A_PRIVATE})
  if(STRATA_WITH_CUDA)
    target_compile_definitions(${name} PUBLIC STRATA_WITH_CUDA=1)
  else()
    target_compile_definitions(${name} PUBLIC STRATA_WITH_CUDA=0)
  endif()
endfunction()

# Sources of a folder: *.cc always; *.cu only with CUDA; files ending in _cuda.cc
# (host code that calls the CUDA runtime) only with CUDA. Tests and benchmarks
# live in their own folders, not here.
function(strata_sources out dir)
  file(GLOB _cc CONFIGURE_DEPENDS ${dir}/*.cc ${dir}/*/*.cc)
  list(FILTER _cc EXCLUDE REGEX "_test\\.cc$")
  if(STRATA_WITH_CUDA)
    file(GLOB _cu CONFIGURE_DEPENDS ${dir}/*.cu ${dir}/*/*.cu)
    list(APPEND _cc ${_cu})
  else()
    list(FILTER _cc EXCLUDE REGEX "_cuda\\.cc$")
  endif()
  set(${out} ${_cc} PARENT_SCOPE)
endfunction()
