# SPDX-License-Identifier: BSD-3-Clause
# What `cmake --install` puts under the prefix, every path relative to it
# so that an installed tree still works once moved (tests/install checks it):
#   lib/libdlock.so.X.Y (SONAME libdlock.so.0.1 while the ABI is 0.x), libdlock.a
#   include/dlock/ (dlock.h, async.h, sys/backend.h, the header-only
#                  adapters/libuv.h and adapters/libevent.h, the generated version.h)
#   lib/pkgconfig/dlock.pc       prefix found from ${pcfiledir}
#   lib/cmake/dlock/             find_package(dlock): dlock::dlock, dlock::dlock_static,
#                                and with COMPONENTS zk postgres mysql, dlock::zk_static ...
#   lib/libdlock_zk.a, lib/pkgconfig/dlock-zk.pc (and postgres, mysql): the
#                                backends' static libraries (below)
# The programs (dlock, dlock-demo) and the man pages install from their own
# folders (cli/, demo/, cmake/DlockManPages.cmake).
include(CMakePackageConfigHelpers)

install(TARGETS dlock EXPORT dlockTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS dlock_static EXPORT dlockStaticTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/dlock DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/include/dlock/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dlock)

# ---- pkg-config: the prefix is where dlock.pc lies, so many levels up ----
# (lib/pkgconfig -> ../.., lib/x86_64-linux-gnu/pkgconfig -> ../../..). An
# absolute libdir or includedir outside the prefix cannot move with it: then
# the paths are written as they are.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(DLOCK_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(DLOCK_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(DLOCK_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH up "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  string(REGEX REPLACE "/$" "" up "${up}")
  set(DLOCK_PC_PREFIX "\${pcfiledir}/${up}")
  set(DLOCK_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(DLOCK_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(dlock.pc.in ${CMAKE_CURRENT_BINARY_DIR}/dlock.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/dlock.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ---- CMake: find_package(dlock) ----
set(DLOCK_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/dlock)
install(EXPORT dlockTargets NAMESPACE dlock:: DESTINATION ${DLOCK_CMAKE_DIR})
install(EXPORT dlockStaticTargets NAMESPACE dlock:: DESTINATION ${DLOCK_CMAKE_DIR})

# ---- The backends' static libraries (docs/static.md) ----
# For a program linked with libdlock.a, which cannot load the modules:
# lib/libdlock_zk.a (the module's code, without its entry), with
# lib/pkgconfig/dlock-zk.pc and dlock::zk_static (find_package(dlock
# COMPONENTS zk)), each in its module's install component.
get_property(DLOCK_STATIC_BACKENDS GLOBAL PROPERTY DLOCK_STATIC_BACKENDS)
set(DLOCK_CONFIG_BACKENDS "set(dlock_static_backends ${DLOCK_STATIC_BACKENDS})\n")
foreach(mod ${DLOCK_STATIC_BACKENDS})
  get_target_property(pkgs dlock_backend_${mod} DLOCK_PKG_CONFIG)
  get_target_property(link dlock_backend_${mod} DLOCK_LINK)
  if(NOT pkgs)
    set(pkgs "")
  endif()
  if(NOT link)
    set(link "")
  endif()
  install(TARGETS dlock_backend_${mod} EXPORT dlock_${mod}Targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT ${mod})
  install(EXPORT dlock_${mod}Targets NAMESPACE dlock:: DESTINATION ${DLOCK_CMAKE_DIR}
          COMPONENT ${mod})
  set(DLOCK_PC_BACKEND ${mod})
  set(DLOCK_PC_BACKEND_REQUIRES "")
  foreach(p ${pkgs})
    string(APPEND DLOCK_PC_BACKEND_REQUIRES " ${p}")
  endforeach()
  set(DLOCK_PC_BACKEND_LIBS "")
  foreach(l ${link})
    string(APPEND DLOCK_PC_BACKEND_LIBS " -l${l}")
  endforeach()
  configure_file(cmake/dlock-backend.pc.in ${CMAKE_CURRENT_BINARY_DIR}/dlock-${mod}.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/dlock-${mod}.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT ${mod})
  string(APPEND DLOCK_CONFIG_BACKENDS "set(dlock_${mod}_pkg_config ${pkgs})\n")
endforeach()
configure_package_config_file(cmake/dlockConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/dlockConfig.cmake
  INSTALL_DESTINATION ${DLOCK_CMAKE_DIR})
# While the ABI is 0.x a minor release breaks it: 0.1 satisfies only 0.1.x.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(DLOCK_COMPAT SameMinorVersion)
else()
  set(DLOCK_COMPAT SameMajorVersion)
endif()
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/dlockConfigVersion.cmake
  COMPATIBILITY ${DLOCK_COMPAT})
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/dlockConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/dlockConfigVersion.cmake
        DESTINATION ${DLOCK_CMAKE_DIR})
