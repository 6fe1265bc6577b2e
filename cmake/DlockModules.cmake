# SPDX-License-Identifier: BSD-3-Clause
# Backend modules (include/dlock/sys/backend.h): a backend that needs a
# client library of its own is a loadable module, so that libdlock and the
# dlock command never link that library. In its folder's CMakeLists.txt:
#
#   dlock_backend_module(zk SOURCES zk.c zk_conn.c LIBRARIES PkgConfig::ZK)
#
# builds
#   - MODULE dlock_module_zk: build/dlock/zk.so, installed as LIBDIR/dlock/zk.so,
#     where libdlock looks for it (build/dlock is beside build/libdlock.so);
#   - STATIC dlock_backend_zk: the same sources without the module entry
#     (DLOCK_BACKEND_MODULE_STATIC), for programs that register the table
#     themselves.
# A module sees only the public headers: the core's dlock__ calls are hidden.
# TEST: a module for the tests alone (no static twin, not installed).
set(DLOCK_MODULE_OUTPUT_DIR ${PROJECT_BINARY_DIR}/dlock)

function(dlock_backend_module mod)
  cmake_parse_arguments(PARSE_ARGV 1 M "TEST" "" "SOURCES;LIBRARIES")
  add_library(dlock_module_${mod} MODULE ${M_SOURCES})
  set_target_properties(dlock_module_${mod} PROPERTIES PREFIX "" OUTPUT_NAME ${mod}
                        LIBRARY_OUTPUT_DIRECTORY ${DLOCK_MODULE_OUTPUT_DIR})
  target_link_libraries(dlock_module_${mod} PRIVATE ${M_LIBRARIES})
  set(targets dlock_module_${mod})
  if(NOT M_TEST)
    add_library(dlock_backend_${mod} STATIC ${M_SOURCES})
    set_target_properties(dlock_backend_${mod} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    target_compile_definitions(dlock_backend_${mod} PRIVATE DLOCK_BACKEND_MODULE_STATIC)
    target_link_libraries(dlock_backend_${mod} PUBLIC ${M_LIBRARIES})
    list(APPEND targets dlock_backend_${mod})
    install(TARGETS dlock_module_${mod} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/dlock
            COMPONENT ${mod})
  endif()
  foreach(t ${targets})
    set_target_properties(${t} PROPERTIES C_VISIBILITY_PRESET hidden)
    target_include_directories(${t} PRIVATE ${DLOCK_INCLUDE_DIRS})
    target_compile_options(${t} PRIVATE ${DLOCK_WARNINGS})
    target_compile_definitions(${t} PRIVATE _GNU_SOURCE)
  endforeach()
endfunction()
