# SPDX-License-Identifier: Apache-2.0
# A project that uses the installed strata, configured, built and run as an
# embedder would (CTest: examples.find_package, install.headers; the
# `install` test fills PREFIX first). cmake -P with:
#   SOURCE   the project           BINARY  its build folder (made afresh)
#   PREFIX   the installed strata  RUN     programs to run from BINARY, comma-separated (may be absent)
#   GENERATOR, C_COMPILER, CXX_COMPILER, BUILD_TYPE   as strata's own build
foreach(v SOURCE BINARY PREFIX GENERATOR CXX_COMPILER C_COMPILER BUILD_TYPE)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "consumer.cmake: -D${v}=... is missing")
  endif()
endforeach()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE ${BINARY})
run("configure" ${CMAKE_COMMAND} -S ${SOURCE} -B ${BINARY} -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${PREFIX} -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
    -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DSTRATA_PREFIX=${PREFIX})
run("build" ${CMAKE_COMMAND} --build ${BINARY})
string(REPLACE "," ";" programs "${RUN}")
foreach(program IN LISTS programs)
  message(STATUS "running ${program}")
  run("${program}" ${BINARY}/${program})
endforeach()
