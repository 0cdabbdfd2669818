# SPDX-License-Identifier: Apache-2.0
# `cmake --install BUILD --prefix PREFIX` into an emptied PREFIX (CTest
# `install`, the fixture of examples.find_package and install.headers), so
# that nothing a previous install left there is seen.  cmake -P with -DBUILD, -DPREFIX.
foreach(v BUILD PREFIX)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "install.cmake: -D${v}=... is missing")
  endif()
endforeach()
file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD} --prefix ${PREFIX} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install ${BUILD} --prefix ${PREFIX} failed (${rc})")
endif()
