# SPDX-License-Identifier: BSD-3-Clause
# The man pages: each man/NAME.SECTION.scd (scdoc, Debian package scdoc)
# becomes NAME.SECTION at build time and installs to share/man/manSECTION
# (man/dlock.1.scd -> man1/dlock.1, man/libdlock.3.scd -> man3/libdlock.3);
# dlock-demo.1 only with the demo (DLOCK_BUILD_DEMO).
# Whatever .scd files man/ holds are built; without scdoc, none is, with a
# warning (-DDLOCK_BUILD_MANPAGES=OFF silences it).
file(GLOB DLOCK_MAN_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/man/*.scd)
if(DLOCK_MAN_SOURCES)
  find_program(DLOCK_SCDOC scdoc)
  if(NOT DLOCK_SCDOC)
    message(WARNING "scdoc not found (apt-get install scdoc): the man pages are not built")
  else()
    set(pages)
    file(MAKE_DIRECTORY ${PROJECT_BINARY_DIR}/man)
    foreach(src ${DLOCK_MAN_SOURCES})
      get_filename_component(page ${src} NAME_WLE) # dlock.1
      if(NOT page MATCHES "\\.([1-9])$")
        message(FATAL_ERROR "${src}: name it NAME.SECTION.scd (like dlock.1.scd)")
      endif()
      set(section ${CMAKE_MATCH_1})
      if(page MATCHES "^dlock-demo\\." AND NOT DLOCK_BUILD_DEMO)
        continue() # the demo's page goes with the demo
      endif()
      set(out ${PROJECT_BINARY_DIR}/man/${page})
      add_custom_command(OUTPUT ${out}
        COMMAND ${CMAKE_COMMAND} -DSCDOC=${DLOCK_SCDOC} -DIN=${src} -DOUT=${out}
                -P ${PROJECT_SOURCE_DIR}/cmake/scdoc.cmake
        DEPENDS ${src} ${PROJECT_SOURCE_DIR}/cmake/scdoc.cmake
        COMMENT "Man page ${page}")
      list(APPEND pages ${out})
      install(FILES ${out} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section})
    endforeach()
    add_custom_target(dlock_man ALL DEPENDS ${pages})
  endif()
endif()
