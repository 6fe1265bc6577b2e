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
#     themselves (docs/static.md). Installed as LIBDIR/libdlock_zk.a, with
#     dlock-zk.pc and the CMake target dlock::zk_static (find_package(dlock
#     COMPONENTS zk)), by cmake/DlockInstall.cmake; it links libdlock.a.
# A module sees only the public headers: the core's dlock__ calls are hidden.
# TEST: a module for the tests alone (no static twin, not installed).
# What a user of the installed static library links besides libdlock.a:
# PKG_CONFIG, pkg-config modules (its dlock-zk.pc requires them, and
# find_package finds them); LINK, libraries by name, of no pkg-config file.
set(DLOCK_MODULE_OUTPUT_DIR ${PROJECT_BINARY_DIR}/dlock)

function(dlock_backend_module mod)
  cmake_parse_arguments(PARSE_ARGV 1 M "TEST" "" "SOURCES;LIBRARIES;PKG_CONFIG;LINK")
  add_library(dlock_module_${mod} MODULE ${M_SOURCES})
  set_target_properties(dlock_module_${mod} PROPERTIES PREFIX "" OUTPUT_NAME ${mod}
                        LIBRARY_OUTPUT_DIRECTORY ${DLOCK_MODULE_OUTPUT_DIR})
  target_link_libraries(dlock_module_${mod} PRIVATE ${M_LIBRARIES})
  set(targets dlock_module_${mod})
  if(NOT M_TEST)
    string(TOUPPER ${mod} MOD)
    add_library(dlock_backend_${mod} STATIC ${M_SOURCES})
    set_target_properties(dlock_backend_${mod} PROPERTIES POSITION_INDEPENDENT_CODE ON
                          OUTPUT_NAME dlock_${mod} EXPORT_NAME ${mod}_static
                          DLOCK_PKG_CONFIG "${M_PKG_CONFIG}" DLOCK_LINK "${M_LINK}")
    target_compile_definitions(dlock_backend_${mod} PRIVATE DLOCK_BACKEND_MODULE_STATIC)
    set(installed ${M_LINK} Threads::Threads)
    if(M_PKG_CONFIG)
      list(PREPEND installed PkgConfig::DLOCK_${MOD}_DEPS)
    endif()
    target_link_libraries(dlock_backend_${mod} PUBLIC dlock_static
                          "$<BUILD_INTERFACE:${M_LIBRARIES}>" "$<INSTALL_INTERFACE:${installed}>")
    set_property(GLOBAL APPEND PROPERTY DLOCK_STATIC_BACKENDS ${mod})
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
