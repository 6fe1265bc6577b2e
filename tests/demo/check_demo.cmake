# SPDX-License-Identifier: BSD-3-Clause
# Runs `dlock demo payout` once in a small, seeded configuration and checks
# its exit status and its --json results.
#
#   cmake -DDEMO=path/to/dlock -DWORK=dir -DCASE=name -P check_demo.cmake
#
# The lock server comes from $DLOCK_TEST_URL (scripts/test.sh exports it),
# except in the `embedded` case, which lets the demo start its own
# redis-server. The `postgres` case takes its store from $DLOCK_DEMO_STORE
# (tests/demo/with_postgres.sh starts a private PostgreSQL and sets it).
cmake_minimum_required(VERSION 3.19)

foreach(v DEMO WORK CASE)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_demo.cmake: -D${v}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
set(json "${WORK}/result.json")
string(RANDOM LENGTH 8 ALPHABET 0123456789abcdef tag)
# A lock name of this run's own: tests may share one server.
set(small --instances 4 --orders 8 --ttl 150ms --pay-time 3ms
          --lock-name "dlock-test-demo:${CASE}:${tag}" --json "${json}")

function(need_url out)
  if("$ENV{DLOCK_TEST_URL}" STREQUAL "")
    message(FATAL_ERROR "DLOCK_TEST_URL is not set: this test needs the Redis server that "
                        "scripts/test.sh starts (run the suite with `make test`)")
  endif()
  set(${out} "$ENV{DLOCK_TEST_URL}" PARENT_SCOPE)
endfunction()

# Run the demo; sets rc, out, err in the caller.
macro(run_demo)
  execute_process(COMMAND "${DEMO}" demo payout ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 110)
  message(STATUS "dlock demo payout ${ARGN}\n-- exit ${rc}\n${out}${err}")
endmacro()

function(expect_rc want)
  if(NOT "${rc}" STREQUAL "${want}")
    message(FATAL_ERROR "expected exit status ${want}, got ${rc}")
  endif()
endfunction()

# get(<var> <mode> <field>): one number from the JSON results.
function(get var mode field)
  file(READ "${json}" doc)
  string(JSON value ERROR_VARIABLE jerr GET "${doc}" modes ${mode} ${field})
  if(jerr)
    message(FATAL_ERROR "results: modes.${mode}.${field}: ${jerr}")
  endif()
  set(${var} "${value}" PARENT_SCOPE)
endfunction()

function(expect mode field op bound)
  get(v ${mode} ${field})
  if(NOT v ${op} ${bound})
    message(FATAL_ERROR "expected ${mode}.${field} ${op} ${bound}, got ${v}")
  endif()
  message(STATUS "ok: ${mode}.${field} = ${v} (${op} ${bound})")
endfunction()

# What every run with pauses must show: the fence mode lost nothing, the
# ttl mode (lease, watchdog, lost-check before each write) did not.
# expect_store(<kind>): the results say the run used that store.
function(expect_store kind)
  file(READ "${json}" doc)
  string(JSON store GET "${doc}" store)
  if(NOT store STREQUAL "${kind}")
    message(FATAL_ERROR "expected store ${kind}, got ${store}")
  endif()
endfunction()

function(expect_fence_safe_ttl_not min_pauses)
  expect(fence double_payouts EQUAL 0)
  expect(fence errors EQUAL 0)
  expect(fence pauses GREATER_EQUAL ${min_pauses})
  expect(fence stale_writes_refused GREATER_EQUAL 1)
  expect(ttl pauses GREATER_EQUAL ${min_pauses})
  expect(ttl double_payouts GREATER_EQUAL 1)
endfunction()

if(CASE STREQUAL "url_all_modes")
  # Many pauses, every mode, against the suite's server.
  need_url(url)
  run_demo(--url "${url}" ${small} --rounds 16 --seed 7 --pause on)
  expect_rc(0)
  expect_fence_safe_ttl_not(4)
  expect(nolock double_payouts GREATER_EQUAL 1)
  # The seeds' per-row check pays twice under pauses too (docs/demo.md):
  # the point of the demo. With --pay-time 3ms B reaches A's order after A.
  expect(fence-per-row pauses GREATER_EQUAL 4)
  expect(fence-per-row double_payouts GREATER_EQUAL 1)
  expect(fence highest_fence GREATER_EQUAL 16)
  expect(fence unpaid EQUAL 0)
  foreach(m nolock ttl fence-per-row fence)
    expect(${m} rounds EQUAL 16)
  endforeach()

elseif(CASE STREQUAL "url_other_seed")
  need_url(url)
  run_demo(--url "${url}" ${small} --rounds 12 --seed 12345 --mode ttl,fence)
  expect_rc(0)
  expect_fence_safe_ttl_not(3)

elseif(CASE STREQUAL "pause_off")
  need_url(url)
  run_demo(--url "${url}" ${small} --rounds 5 --seed 1 --pause off --mode ttl,fence)
  expect_rc(0)
  expect(fence pauses EQUAL 0)
  expect(ttl pauses EQUAL 0)
  expect(fence double_payouts EQUAL 0)
  expect(fence stale_writes_refused EQUAL 0)

elseif(CASE STREQUAL "embedded")
  # No --url: the demo starts, and stops, a throwaway redis-server. The one
  # it finds in PATH is a wrapper that writes down its arguments and the
  # mode of its socket's folder, then runs the real one: the server has no
  # password, so it must have no TCP port, and its socket a 0700 folder.
  find_program(real_redis redis-server REQUIRED)
  set(bin "${WORK}/bin")
  file(MAKE_DIRECTORY "${bin}")
  string(CONFIGURE [=[#!/bin/sh
prev= sock=
for a in "$@"; do
    [ "$prev" = --unixsocket ] && sock=$a
    prev=$a
done
printf '%s\n' "$@" > '@WORK@/redis-args'
stat -c %a "$(dirname "$sock")" > '@WORK@/socket-folder-mode'
exec '@real_redis@' "$@"
]=] wrapper @ONLY)
  file(WRITE "${bin}/redis-server" "${wrapper}")
  file(CHMOD "${bin}/redis-server" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
  set(ENV{PATH} "${bin}:$ENV{PATH}")
  set(report "${WORK}/report.html")
  # A SQLite store whose path holds HTML's special characters: the report
  # must show it escaped.
  set(store "${WORK}/st<b>\"x\"&amp.db")
  run_demo(${small} --rounds 6 --seed 3 --mode ttl,fence --report "${report}" --store "${store}")
  expect_rc(0)
  file(READ "${WORK}/redis-args" args)
  string(REPLACE "\n" ";" args "${args}")
  foreach(want "--port=0" "--unixsocketperm=700")
    string(REPLACE "=" ";" want "${want}")
    list(GET want 0 flag)
    list(GET want 1 value)
    list(FIND args "${flag}" at)
    set(got "(none)")
    if(at GREATER_EQUAL 0)
      math(EXPR at "${at} + 1")
      list(GET args ${at} got)
    endif()
    if(NOT got STREQUAL value)
      message(FATAL_ERROR "the embedded redis-server has ${flag} ${got}, want ${value} "
                          "(no TCP port, a socket for its user only): ${args}")
    endif()
  endforeach()
  file(STRINGS "${WORK}/socket-folder-mode" mode)
  if(NOT mode STREQUAL "700")
    message(FATAL_ERROR "the embedded redis-server's socket folder has mode ${mode}, want 700")
  endif()
  if(NOT out MATCHES "throwaway redis-server at unix:///[^ \n]+/redis\\.sock")
    message(FATAL_ERROR "the output does not name the throwaway redis-server's unix socket")
  endif()
  file(READ "${json}" doc)
  string(JSON server GET "${doc}" lock_server)
  if(NOT server STREQUAL "embedded")
    message(FATAL_ERROR "expected lock_server embedded, got ${server}")
  endif()
  expect_fence_safe_ttl_not(1)
  # The report: one self-contained page with a timeline per mode.
  file(READ "${report}" html)
  string(REGEX MATCHALL "<svg xmlns" svgs "${html}")
  list(LENGTH svgs nsvg)
  if(NOT nsvg EQUAL 2)
    message(FATAL_ERROR "expected 2 timelines in the report, found ${nsvg}")
  endif()
  string(FIND "${html}" "st&lt;b&gt;&quot;x&quot;&amp;amp.db" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "the report does not show the store's path escaped")
  endif()
  string(FIND "${html}" "st<b>" pos)
  if(NOT pos EQUAL -1)
    message(FATAL_ERROR "the report shows the store's path unescaped (HTML from a value)")
  endif()
  foreach(bad "<script" "src=" "href=" "@import" "url(http")
    string(FIND "${html}" "${bad}" pos)
    if(NOT pos EQUAL -1)
      message(FATAL_ERROR "the report is not self-contained: it holds ${bad}")
    endif()
  endforeach()
  foreach(want "class=\"dbl\"" "class=\"refused\"" "class=\"pause\"" "class=\"held\"")
    string(FIND "${html}" "${want}" pos)
    if(pos EQUAL -1)
      message(FATAL_ERROR "the report has no ${want} mark")
    endif()
  endforeach()

elseif(CASE STREQUAL "postgres")
  need_url(url)
  if("$ENV{DLOCK_DEMO_STORE}" STREQUAL "")
    message(FATAL_ERROR "DLOCK_DEMO_STORE is not set: run this case through with_postgres.sh")
  endif()
  run_demo(--url "${url}" ${small} --rounds 10 --seed 7 --store "$ENV{DLOCK_DEMO_STORE}")
  expect_rc(0)
  expect_store(postgres)
  expect_fence_safe_ttl_not(3)
  expect(nolock double_payouts GREATER_EQUAL 1)

elseif(CASE STREQUAL "postgres_lock")
  # PostgreSQL as the lock server (lease mode, the fence from its sequence)
  # and as the store: one database, nothing else.
  if("$ENV{DLOCK_DEMO_STORE}" STREQUAL "")
    message(FATAL_ERROR "DLOCK_DEMO_STORE is not set: run this case through with_postgres.sh")
  endif()
  # A longer lease than ${small}'s, as for MariaDB below: with 150 ms, a
  # holder whose lease ran out before it reached the chosen order was never
  # frozen on a loaded machine (2 pauses of 3).
  run_demo(--lock "$ENV{DLOCK_DEMO_STORE}" ${small} --ttl 400ms --rounds 10 --seed 7
           --store "$ENV{DLOCK_DEMO_STORE}")
  expect_rc(0)
  file(READ "${json}" doc)
  string(JSON server GET "${doc}" lock_server)
  if(NOT server STREQUAL "url" OR NOT out MATCHES "lock server: postgresql://demo@/postgres")
    message(FATAL_ERROR "expected the PostgreSQL as the lock server, got ${server}")
  endif()
  expect_fence_safe_ttl_not(3)
  expect(nolock double_payouts GREATER_EQUAL 1)
  expect(fence highest_fence GREATER_EQUAL 10)
elseif(CASE STREQUAL "mysql")
  # MariaDB as the lock server (lease mode) and as the store: scripts/test.sh
  # exports its URL.
  if("$ENV{DLOCK_TEST_MYSQL_URL}" STREQUAL "")
    message(FATAL_ERROR "DLOCK_TEST_MYSQL_URL is not set: this test needs the MariaDB that "
                        "scripts/test.sh starts (run the suite with `make test`)")
  endif()
  # A longer lease than ${small}'s: every step is a round trip with a
  # durable commit, and a holder whose lease ran out before it reached the
  # chosen order is never frozen (fewer pauses).
  run_demo(--lock "$ENV{DLOCK_TEST_MYSQL_URL}" --store "$ENV{DLOCK_TEST_MYSQL_URL}" ${small}
           --ttl 400ms --rounds 10 --seed 7)
  expect_rc(0)
  expect_store(mysql)
  expect_fence_safe_ttl_not(3)
  expect(nolock double_payouts GREATER_EQUAL 1)
  expect(fence unpaid EQUAL 0)

elseif(CASE STREQUAL "usage")
  foreach(args "--instances;1" "--mode;bogus" "--ttl;0" "--pause;maybe" "--seed;-1"
               "--bogus" "--rounds" "--url;redis://127.0.0.1:6379?cacert=/dev/null")
    run_demo(${args})
    expect_rc(64)
  endforeach()
  execute_process(COMMAND "${DEMO}" demo nosuchdemo RESULT_VARIABLE rc
                  OUTPUT_QUIET ERROR_QUIET)
  expect_rc(64)
  execute_process(COMMAND "${DEMO}" demo payout --help RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_QUIET)
  expect_rc(0)
  if(NOT out MATCHES "--report FILE")
    message(FATAL_ERROR "--help does not describe the options")
  endif()

elseif(CASE STREQUAL "unreachable")
  # Nothing listens on port 1: a clear message, exit 69, nothing forked.
  run_demo(--url redis://127.0.0.1:1 --rounds 2)
  expect_rc(69)
  if(NOT err MATCHES "127\\.0\\.0\\.1:1")
    message(FATAL_ERROR "the message does not name the server: ${err}")
  endif()
  run_demo(--rounds 2 --store "${WORK}/no/such/dir/store.db")
  expect_rc(69)
  if(NOT err MATCHES "store")
    message(FATAL_ERROR "the message does not name the store: ${err}")
  endif()

else()
  message(FATAL_ERROR "unknown case ${CASE}")
endif()

file(REMOVE_RECURSE "${WORK}")
