# SPDX-License-Identifier: BSD-3-Clause
# Read by CTest, not CMake (a TEST_INCLUDE_FILES script that dlock_add_cases
# in tests/CMakeLists.txt writes for each test program): asks the program for
# its cases (PROGRAM --list prints "NAME LABELS" a line) and adds one test
# per case, named PREFIX.NAME, run as PROGRAM ARGS... NAME. A case added in
# C therefore always runs; there is no second list to forget it in.
#
# In: DLOCK_CASES_EXE, DLOCK_CASES_PREFIX, DLOCK_CASES_ARGS (a list) and
# DLOCK_CASES_LABELS (the program's labels; a case may add its own),
# DLOCK_CASES_MODULE_DIR (build/dlock, where the backend modules are).
execute_process(COMMAND "${DLOCK_CASES_EXE}" --list
                OUTPUT_VARIABLE dlock_out ERROR_VARIABLE dlock_err
                RESULT_VARIABLE dlock_rc)
if(NOT dlock_rc EQUAL 0)
  message(FATAL_ERROR "${DLOCK_CASES_EXE} --list failed (${dlock_rc}): ${dlock_err}")
endif()
string(REPLACE "\n" ";" dlock_lines "${dlock_out}")
set(dlock_count 0)
foreach(dlock_line IN LISTS dlock_lines)
  if(dlock_line STREQUAL "")
    continue()
  endif()
  if(NOT dlock_line MATCHES "^([A-Za-z0-9_]+) ?(.*)$")
    message(FATAL_ERROR "${DLOCK_CASES_EXE} --list: bad line '${dlock_line}'")
  endif()
  set(dlock_name ${DLOCK_CASES_PREFIX}.${CMAKE_MATCH_1})
  set(dlock_labels ${DLOCK_CASES_LABELS} ${CMAKE_MATCH_2})
  add_test(${dlock_name} "${DLOCK_CASES_EXE}" ${DLOCK_CASES_ARGS} ${CMAKE_MATCH_1})
  set_tests_properties(${dlock_name} PROPERTIES LABELS "${dlock_labels}" TIMEOUT 120
                      ENVIRONMENT "DLOCK_MODULE_DIR=${DLOCK_CASES_MODULE_DIR}")
  # A case labelled "ensemble" runs three ZooKeeper JVMs: one of the
  # CPU-heavy cases, run one at a time and early (scripts/test.sh runs more
  # cases than cores; tests/CMakeLists.txt has the others: both locks of
  # DLOCK_CPU_HEAVY). Not "scale": the CPU-heavy cases already run one after
  # another for about as long as the whole plain suite, and the scale cases
  # ride out a loaded machine (leases of seconds, renewed at a third).
  if("${dlock_labels}" MATCHES "(^|;| )ensemble(;| |$)")
    set_tests_properties(${dlock_name} PROPERTIES RESOURCE_LOCK "cpu_heavy;cpu_heavy_2" COST 75)
  endif()
  math(EXPR dlock_count "${dlock_count} + 1")
endforeach()
if(dlock_count EQUAL 0)
  message(FATAL_ERROR "${DLOCK_CASES_EXE} --list: no cases")
endif()
