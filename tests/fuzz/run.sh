#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Builds the libFuzzer targets with clang (-fsanitize=fuzzer,address,undefined)
# in their own build folder and runs each one for a bounded time:
#   1. every file in tests/fuzz/regressions/<target>/ once (what fuzzing found
#      before: each must pass now);
#   2. fuzzing from tests/fuzz/corpus/<target>/ for SECONDS (new inputs go to a
#      scratch folder, never into the tree).
# A crash, leak, sanitizer report or failed invariant fails the run; the
# input that did it is left in the scratch folder, named in the output: copy
# it to regressions/<target>/ once the bug is fixed.
#
#   tests/fuzz/run.sh [BUILD_DIR] [SECONDS] [TARGET...]
#   tests/fuzz/run.sh --build-only [BUILD_DIR] [TARGET...]
#
# --build-only builds the targets and runs nothing: scripts/test.sh builds
# them so in the background once the plain build is done, while the plain
# suite runs, and the suite's fuzz cases (which call this script on the same
# folder, last of the CPU-heavy cases) then find them built and only run
# them. One run of this script at a time builds in a folder (a lock file in
# it): a case that comes while the build is still going waits for it. The
# folder is configured once (again when these options change); after that a
# build is CMake's own check of what changed.
# DLOCK_FUZZ_SEED=N fixes libFuzzer's seed. The suite's short runs (ctest's
# fuzz.bounded and fuzz.inprocess) set it, so that they explore about the
# same inputs on every machine and a red CI means a regression, not the luck
# of the draw; `make fuzz` leaves it unset and explores anew each time.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build_only=0
if [ "${1:-}" = --build-only ]; then
    build_only=1
    shift
fi
build=${1:-$src/build-fuzz}
if [ $build_only = 1 ]; then
    shift 1 2>/dev/null || shift $#
else
    seconds=${2:-30}
    shift 2 2>/dev/null || shift $#
fi
# The in-process targets (a parser fed from memory) after the two that go
# through a socket; zk_names and sql_rows need their backend modules.
targets=${*:-"url duration resp redis_cluster redis_sentinel etcd_codec etcd_grpc zk_names sql_rows redis_reply etcd_reply"}

command -v clang >/dev/null || {
    echo "fuzz: clang is missing (apt-get install clang libclang-rt-14-dev; scripts/deps.sh does)" >&2
    exit 1
}
echo "== fuzz: building in $build"
mkdir -p "$build"
exec 9>"$build/fuzz-build.lock"
flock 9
log="$build/fuzz-build.log"
# Configured when the folder is new or was configured otherwise (a folder of
# an older run.sh); cmake --build below configures again by itself when a
# CMakeLists.txt changed.
configure=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLOCK_FUZZ=ON "-DDLOCK_SANITIZE=address,undefined"
    -DDLOCK_BUILD_BENCH=OFF -DDLOCK_WERROR=ON)
if [ ! -f "$build/CMakeCache.txt" ] || [ "$(cat "$build/fuzz-configure" 2>/dev/null)" != "${configure[*]}" ]; then
    rm -f "$build/fuzz-configure"
    CC=clang cmake -S "$src" -B "$build" "${configure[@]}" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
    printf '%s\n' "${configure[*]}" >"$build/fuzz-configure"
else
    : >"$log"
fi
# A target whose backend module is configured off (zk_names, sql_rows) is
# said and left out. The rest are built in one go (one dependency check of
# the library, the targets compiled side by side).
known=$(cmake --build "$build" --target help 2>/dev/null)
built=""
names=()
for t in $targets; do
    if ! grep -qw "fuzz_$t" <<<"$known"; then
        echo "== fuzz_$t: not configured (its backend module is off), left out"
        continue
    fi
    built="$built $t"
    names+=("fuzz_$t")
done
targets=$built
if [ ${#names[@]} -gt 0 ]; then
    cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target "${names[@]}" >>"$log" 2>&1 ||
        { tail -50 "$log" >&2; exit 1; }
fi
[ $build_only = 1 ] && exit 0
exec 9>&-

export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
scratch=$(mktemp -d /tmp/dlock-fuzz-XXXXXX)
status=0
for t in $targets; do
    bin=$(find "$build" -name "fuzz_$t" -type f -perm -u+x | head -1)
    regressions=("$src/tests/fuzz/regressions/$t"/*)
    if [ -e "${regressions[0]}" ]; then
        echo "== fuzz_$t: ${#regressions[@]} regression input(s)"
        "$bin" -runs=1 "${regressions[@]}" >"$scratch/$t.regress.log" 2>&1 ||
            { cat "$scratch/$t.regress.log" >&2; status=1; continue; }
    fi
    mkdir -p "$scratch/$t"
    echo "== fuzz_$t: $seconds s from tests/fuzz/corpus/$t"
    if "$bin" ${DLOCK_FUZZ_SEED:+-seed="$DLOCK_FUZZ_SEED"} -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$scratch/$t-" -print_final_stats=1 \
        "$scratch/$t" "$src/tests/fuzz/corpus/$t" >"$scratch/$t.log" 2>&1; then
        grep -E "^stat::number_of_executed_units|^stat::new_units_added|^stat::peak_rss_mb" \
            "$scratch/$t.log" | sed 's/^/   /'
        grep -E "^#[0-9]+.*DONE" "$scratch/$t.log" | tail -1 | sed 's/^/   /'
    else
        tail -60 "$scratch/$t.log" >&2
        echo "fuzz_$t FAILED; the input is in $scratch ($(ls "$scratch" | grep "^$t-" | tr '\n' ' '))" >&2
        status=1
    fi
done
[ $status -eq 0 ] && rm -rf "$scratch"
exit $status
