# SPDX-License-Identifier: Apache-2.0
# Decides whether the CUDA parts are built.
#   STRATA_WITH_CUDA  ON/OFF for the rest of the build.
# CUDA architectures default to the local GPU's compute capability (read with
# nvidia-smi), else 90 (H100/H200). Override with -DCMAKE_CUDA_ARCHITECTURES="80;86;89;90".
# 90 is built as 90a (below).
set(STRATA_WITH_CUDA OFF)
set(STRATA_CUDA_SUMMARY "")
if(NOT STRATA_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
      set(_arch "")
      find_program(STRATA_NVIDIA_SMI nvidia-smi)
      if(STRATA_NVIDIA_SMI)
        execute_process(COMMAND ${STRATA_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                        OUTPUT_VARIABLE _cc RESULT_VARIABLE _rc ERROR_QUIET
                        OUTPUT_STRIP_TRAILING_WHITESPACE)
        if(_rc EQUAL 0 AND _cc MATCHES "^([0-9]+)\\.([0-9]+)")
          set(_arch "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
        endif()
      endif()
      if(_arch STREQUAL "")
        set(_arch 90)
      endif()
      set(CMAKE_CUDA_ARCHITECTURES ${_arch} CACHE STRING "CUDA architectures (local GPU, else 90)")
    endif()
    # Hopper's warpgroup MMA (the wgmma attention kernels) exists only in
    # the arch-specific target: build 90 as 90a. Its code runs on compute
    # capability 9.0 exactly (H100/H200), which is what 90 means in practice.
    set(_archs "")
    foreach(_a IN LISTS CMAKE_CUDA_ARCHITECTURES)
      if(_a STREQUAL "90")
        set(_a "90a")
      endif()
      list(APPEND _archs "${_a}")
    endforeach()
    set(CMAKE_CUDA_ARCHITECTURES "${_archs}")
    if("90a" IN_LIST CMAKE_CUDA_ARCHITECTURES)
      add_compile_definitions(STRATA_CUDA_SM90A=1)
    endif()
    enable_language(CUDA)
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      # CMake < 3.26 does not know that nvcc >= 12 takes -std=c++20.
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
      set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(STRATA_WITH_CUDA ON)
    set(STRATA_CUDA_SUMMARY " (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, sm ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(STRATA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STRATA_CUDA=ON but no CUDA compiler (nvcc) was found. "
                        "Install the CUDA Toolkit or put nvcc on PATH, or configure with -DSTRATA_CUDA=AUTO.")
  else()
    message(STATUS "strata: nvcc not found — building without CUDA. The GPU tier runs on its "
                   "host-memory stand-in and the kernels on the CPU backend. Put nvcc on PATH "
                   "(or set CMAKE_CUDA_COMPILER) to build the CUDA parts.")
  endif()
endif()
