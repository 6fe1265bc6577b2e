#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# An installed dlock, as a user gets it, moved after installing:
#   tests/install/check_install.sh SOURCE_DIR BUILD_DIR
#   tests/install/check_install.sh SOURCE_DIR --installed PREFIX
# 1. cmake --install into a temporary prefix, then move the prefix elsewhere
#    (--installed: a tree installed otherwise, as the .debs unpacked by
#    check_debs.sh, whose programs have no RPATH);
# 2. the README's example (its first C block, with a main) builds against the
#    moved tree with `pkg-config --cflags --libs dlock` (PKG_CONFIG_PATH only,
#    no --define-prefix) and with a CMake project (find_package(dlock),
#    dlock::dlock, and dlock::dlock_static), and runs;
# 3. the library's SONAME carries the minor version while the ABI is 0.x;
# 4. `man` renders every installed page, found as `man NAME` too;
# 5. the installed dlock runs, and links no database library (the demo is
#    its own program, dlock-demo; database backends are modules);
# 6. it loads the installed backend modules from the moved tree;
# 7. a program linked with libdlock.a and a backend's static library
#    (find_package(dlock COMPONENTS zk ...), dlock::zk_static; pkg-config
#    dlock-zk) registers its table and reaches the server: refused on port 1,
#    or, when scripts/test.sh runs a ZooKeeper (DLOCK_TEST_ZK_URL), a lock
#    acquired and released on it. Unregistered, it is told what to link; with
#    -rdynamic it loads the module.
# Needs cc, cmake, pkg-config; man when pages were built. Exits non-zero,
# saying why, on the first thing that fails.
set -eu
src=$(cd "$1" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/dlock-install-XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
fail() { echo "check_install: FAIL: $*" >&2; exit 1; }
ok() { echo "check_install: ok: $*"; }

# ---- 1. install, then move ----
rpath=1
if [ "$2" = "--installed" ]; then
    prefix=$(cd "$3" && pwd)
    rpath=0
else
    build=$(cd "$2" && pwd)
    cmake --install "$build" --prefix "$work/first" >"$work/install.log" 2>&1 ||
        { cat "$work/install.log" >&2; fail "cmake --install"; }
    mv "$work/first" "$work/moved"
    prefix="$work/moved"
fi
pc=$(find "$prefix" -name dlock.pc -path '*/pkgconfig/*')
[ -n "$pc" ] || fail "no dlock.pc under $prefix"
libdir=$(dirname "$(dirname "$pc")")
grep -q "$work/first" "$pc" && fail "$pc names the install prefix $work/first: not relocatable"
ok "installed and moved to $prefix (libdir ${libdir#"$prefix"/})"

# ---- 2. the README's example ----
# The first C block after "## In C", with a stand-in for its store and a main
# that prints the headers' and the library's versions. Port 1 refuses, so
# the example fails to connect (exit 1) and touches no server.
awk '/^## In C/ { inc = 1 } inc && /^```c$/ { on = 1; next } on && /^```$/ { exit } on { print }' \
    "$src/README.md" >"$work/readme.c"
grep -q "dlock_acquire" "$work/readme.c" || fail "no C example found in README.md's \"## In C\""
{
    echo '#include <stdint.h>'
    echo '#include <string.h>'
    echo 'static void pay_with_fence(uint64_t fence) { (void)fence; }'
    sed 's|redis://127.0.0.1:6379|redis://127.0.0.1:1|' "$work/readme.c"
    cat <<'C'
int main(void)
{
    printf("headers %s (%d), library %s\n", DLOCK_VERSION, DLOCK_VERSION_NUMBER, dlock_version());
    if (DLOCK_VERSION_NUMBER != ((DLOCK_VERSION_MAJOR << 16) | (DLOCK_VERSION_MINOR << 8) | DLOCK_VERSION_PATCH) ||
        !DLOCK_VERSION_AT_LEAST(DLOCK_VERSION_MAJOR, DLOCK_VERSION_MINOR, 0) ||
        DLOCK_VERSION_AT_LEAST(DLOCK_VERSION_MAJOR, DLOCK_VERSION_MINOR + 1, 0) ||
        strcmp(DLOCK_VERSION, dlock_version()) != 0)
        return 3;
    return pay_pending_orders() == DLOCK_ECONN ? 1 : 2;
}
C
} >"$work/app.c"

run_app() { # what binary
    set +e
    out=$(LD_LIBRARY_PATH="$libdir" "$2" 2>&1)
    rc=$?
    set -e
    echo "$out" | sed 's/^/    /'
    [ "$rc" -eq 1 ] || fail "$1: the example exited $rc, not 1 (connection refused)"
    echo "$out" | grep -q "^headers $version (.*), library $version$" || fail "$1: versions differ"
}
version=$(sed -n 's/^Version: *//p' "$pc")

export PKG_CONFIG_PATH="$libdir/pkgconfig"
flags=$(pkg-config --cflags --libs dlock) || fail "pkg-config --cflags --libs dlock"
case "$flags" in *"$prefix"*) ;; *) fail "pkg-config gives '$flags', not paths under $prefix" ;; esac
# shellcheck disable=SC2086 # the flags are words
cc -std=c11 -Wall -Wextra -Werror -o "$work/app-pc" "$work/app.c" $flags ||
    fail "the README's example does not build with pkg-config ($flags)"
run_app pkg-config "$work/app-pc"
ok "the README's example builds with pkg-config: $flags"

mkdir -p "$work/cmake-app"
cp "$work/app.c" "$work/cmake-app/app.c"
cat >"$work/cmake-app/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.16)
project(app LANGUAGES C)
find_package(dlock REQUIRED)
add_executable(app app.c)
target_link_libraries(app PRIVATE dlock::dlock)
add_executable(app-static app.c)
target_link_libraries(app-static PRIVATE dlock::dlock_static)
CMAKE
cmake -S "$work/cmake-app" -B "$work/cmake-app/build" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" >"$work/cmake.log" 2>&1 ||
    { cat "$work/cmake.log" >&2; fail "find_package(dlock)"; }
cmake --build "$work/cmake-app/build" >>"$work/cmake.log" 2>&1 ||
    { cat "$work/cmake.log" >&2; fail "the README's example does not build with dlock::dlock"; }
run_app dlock::dlock "$work/cmake-app/build/app"
readelf -d "$work/cmake-app/build/app-static" | grep -q 'NEEDED.*libdlock' &&
    fail "app-static (dlock::dlock_static) needs libdlock.so"
run_app dlock::dlock_static "$work/cmake-app/build/app-static"
ok "the README's example builds with find_package(dlock): dlock::dlock and dlock::dlock_static"

# ---- 3. the SONAME ----
major=${version%%.*}
minor=${version#*.}
minor=${minor%%.*}
[ "$major" = 0 ] && want="libdlock.so.$major.$minor" || want="libdlock.so.$major"
soname=$(readelf -d "$libdir/libdlock.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "$want" ] || fail "SONAME $soname, expected $want"
[ -f "$libdir/libdlock.a" ] || fail "no libdlock.a beside libdlock.so"
ok "SONAME $soname; libdlock.a installed"

# ---- 4. man pages ----
pages=$(find "$prefix/share/man" -type f 2>/dev/null || true)
if command -v scdoc >/dev/null; then
    for scd in "$src"/man/*.scd; do
        [ -e "$scd" ] || continue
        name=$(basename "$scd" .scd)
        echo "$pages" | grep -Eq "/man${name##*.}/$name(\.gz)?$" || fail "man/$name.scd was not installed as a page"
    done
fi
if [ -n "$pages" ]; then
    command -v man >/dev/null || fail "man pages installed but no man to render them (apt-get install man-db)"
    for page in $pages; do
        name=$(basename "$page" .gz)
        out=$(MANWIDTH=80 man -l "$page" 2>"$work/man.err") || fail "man -l $page"
        [ -s "$work/man.err" ] && { cat "$work/man.err" >&2; fail "man -l $page warns"; }
        [ "$(echo "$out" | wc -l)" -gt 5 ] || fail "man -l $page renders almost nothing"
        MANWIDTH=80 man -M "$prefix/share/man" "${name%.*}" >/dev/null 2>&1 ||
            fail "man ${name%.*} does not find $page"
        ok "man ${name%.*} renders ($(echo "$out" | wc -l) lines)"
    done
else
    echo "check_install: no man pages installed (scdoc missing, or DLOCK_BUILD_MANPAGES=OFF)"
fi

# ---- 5. the dlock command ----
dlock="$prefix/bin/dlock"
[ -x "$dlock" ] || fail "no $dlock"
# Without an RPATH (the .debs), the moved tree's library by the loader's path.
[ "$rpath" = 1 ] || export LD_LIBRARY_PATH="$libdir"
"$dlock" --version | grep -qx "dlock $version" || fail "$dlock --version: $("$dlock" --version)"
libs=$(ldd "$dlock") || fail "ldd $dlock"
loaded=$(echo "$libs" | sed -n 's/^[[:space:]]*libdlock\.so[^ ]* => \([^ ]*\) .*/\1/p')
[ -n "$loaded" ] && [ "$(readlink -f "$loaded")" = "$(readlink -f "$libdir/libdlock.so")" ] ||
    fail "the moved dlock does not load the moved libdlock ($loaded): $libs"
echo "$libs" | grep -Ei 'libpq|libsqlite|libmysql|libmariadb' &&
    fail "the installed dlock links a database library"
if [ -x "$prefix/bin/dlock-demo" ]; then
    "$dlock" demo --help | grep -q "payout" || fail "dlock demo --help does not run the installed dlock-demo"
    ok "dlock demo runs the installed dlock-demo"
fi
ok "the installed dlock runs from the moved tree and links no database library"

# ---- 6. backend modules, found beside the moved libdlock ----
# Each installed module (LIBDIR/dlock/*.so) needs only the public calls; the
# dlock command loads one by its scheme from the moved tree (no
# DLOCK_MODULE_DIR), and a connection refused on port 1 shows it was loaded.
unset DLOCK_MODULE_DIR
for so in "$libdir"/dlock/*.so; do
    [ -e "$so" ] || continue
    mod=$(basename "$so" .so)
    out=$("$dlock" --url "$mod://127.0.0.1:1/x" status x 2>&1) && fail "$mod:// to port 1 succeeded: $out"
    case $out in
    *"needs the backend module"* | *"not known"* | *"could not be loaded"*) fail "the moved dlock did not load $so: $out" ;;
    esac
    ok "the moved dlock loads the $mod module ($out)"
done
out=$("$dlock" --url "zk://127.0.0.1:1/x" status x 2>&1) || true
if [ ! -e "$libdir/dlock/zk.so" ]; then
    case $out in
    *"needs the backend module zk.so, found in neither $prefix/"*"/dlock nor"*) ok "a missing module is named with the moved tree's directory" ;;
    *) fail "zk:// without zk.so: $out" ;;
    esac
fi

# ---- 7. static programs with the backends' static libraries ----
# app.c registers the table of BACKEND twice (the second call changes
# nothing) and checks two refusals, unless told --unregistered; then it
# opens a client on the URL it is given and takes a lock: exit 0 when it got
# and released one, 1 when the server could not be reached, 2 otherwise.
# Built without BACKEND, it registers nothing.
backends=""
for a in "$libdir"/libdlock_*.a; do
    [ -e "$a" ] || continue
    b=${a##*/libdlock_}
    backends="$backends ${b%.a}"
done
# cmake --install puts each beside its module; packages may ship them apart.
[ -z "$backends" ] && [ "$2" != "--installed" ] && ls "$libdir"/dlock/*.so >/dev/null 2>&1 &&
    fail "backend modules installed without their static libraries (libdlock_NAME.a)"
if [ -n "$backends" ]; then
    mkdir -p "$work/static-app"
    cat >"$work/static-app/app.c" <<'C'
#include <dlock/dlock.h>
#include <dlock/sys/backend.h>
#include <stdio.h>
#include <string.h>

#define TABLE_(b) dlock_##b##_backend
#define TABLE(b) TABLE_(b)

int main(int argc, char **argv)
{
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    int rc;

    if (argc < 2)
        return 64;
    if (dlock_backend_register_table(NULL) != DLOCK_EINVAL ||
        strstr(dlock_error_message(), "backend is NULL") == NULL) {
        printf("dlock_backend_register_table(NULL): %s\n", dlock_error_message());
        return 2;
    }
#ifdef BACKEND
    if (argc < 3 || strcmp(argv[2], "--unregistered") != 0) {
        dlock_backend other = *TABLE(BACKEND)();

        if (dlock_backend_register_table(TABLE(BACKEND)()) != DLOCK_OK ||
            dlock_backend_register_table(TABLE(BACKEND)()) != DLOCK_OK) {
            printf("register: %s\n", dlock_error_message());
            return 2;
        }
        /* Another table for the same schemes, and one of none. */
        if (dlock_backend_register_table(&other) != DLOCK_EINVAL ||
            strstr(dlock_error_message(), "is already served") == NULL) {
            printf("a second table: %s\n", dlock_error_message());
            return 2;
        }
        other.schemes = NULL;
        if (dlock_backend_register_table(&other) != DLOCK_EINVAL ||
            strstr(dlock_error_message(), "lists no schemes") == NULL) {
            printf("a table of no schemes: %s\n", dlock_error_message());
            return 2;
        }
    }
#endif
    /* Port 1 refuses: ZooKeeper's client retries until the timeout. */
    if (strstr(argv[1], "127.0.0.1:1/") != NULL)
        o.connect_timeout_ms = 200;
    if ((rc = dlock_client_open(&c, argv[1], &o)) != DLOCK_OK) {
        printf("open: %s: %s\n", dlock_strerror(rc), dlock_error_message());
        return rc == DLOCK_ECONN ? 1 : 2;
    }
    if ((rc = dlock_acquire(&l, c, "install-static-app", NULL)) == DLOCK_OK) {
        printf("acquired, fence %llu\n", (unsigned long long)dlock_lock_fence(l));
        rc = dlock_release(l);
    }
    if (rc != DLOCK_OK)
        printf("acquire or release: %s: %s\n", dlock_strerror(rc), dlock_error_message());
    dlock_client_free(c);
    return rc == DLOCK_OK ? 0 : 2;
}
C
    cat >"$work/static-app/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.16)
project(app LANGUAGES C)
find_package(dlock REQUIRED COMPONENTS ${BACKENDS})
foreach(b ${BACKENDS})
  add_executable(app-${b} app.c)
  target_compile_definitions(app-${b} PRIVATE BACKEND=${b})
  target_link_libraries(app-${b} PRIVATE dlock::${b}_static)
endforeach()
# No backend linked in: it loads the modules, its dlock calls exported.
add_executable(app-rdynamic app.c)
set_target_properties(app-rdynamic PROPERTIES ENABLE_EXPORTS ON)
target_link_libraries(app-rdynamic PRIVATE dlock::dlock_static)
CMAKE
    # shellcheck disable=SC2086 # the list is words
    list=$(echo $backends | tr ' ' ';')
    cmake -S "$work/static-app" -B "$work/static-app/build" -DCMAKE_PREFIX_PATH="$prefix" \
        "-DBACKENDS=$list" -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" >"$work/static.log" 2>&1 ||
        { cat "$work/static.log" >&2; fail "find_package(dlock COMPONENTS$backends)"; }
    cmake --build "$work/static-app/build" --parallel 2 >>"$work/static.log" 2>&1 ||
        { cat "$work/static.log" >&2; fail "a static program does not build with dlock::NAME_static"; }
    # run_static WHAT WANT BINARY ARG...: runs it, fails unless it exits WANT
    run_static() {
        what=$1 want=$2
        shift 2
        set +e
        out=$("$@" 2>&1)
        rc=$?
        set -e
        echo "$out" | sed 's/^/    /'
        [ "$rc" -eq "$want" ] || fail "$what: exited $rc, not $want"
    }
    for b in $backends; do
        app="$work/static-app/build/app-$b"
        readelf -d "$app" | grep -q 'NEEDED.*libdlock' && fail "app-$b (dlock::${b}_static) needs libdlock.so"
        run_static "app-$b" 1 "$app" "$b://127.0.0.1:1/x"
        echo "$out" | grep -q "cannot reach" || fail "app-$b: not refused by port 1: $out"
        run_static "app-$b --unregistered" 2 "$app" "$b://127.0.0.1:1/x" --unregistered
        echo "$out" | grep -Fq "cannot load: link libdlock_$b.a" ||
            fail "app-$b --unregistered: no advice to link libdlock_$b.a: $out"
        ok "a program linked with libdlock.a and dlock::${b}_static reaches $b://; unregistered, it is told what to link"
    done
    case " $backends " in
    *" zk "*)
        if [ -n "${DLOCK_TEST_ZK_URL:-}" ]; then
            run_static "app-zk on $DLOCK_TEST_ZK_URL" 0 "$work/static-app/build/app-zk" "$DLOCK_TEST_ZK_URL"
            ok "app-zk (static) took and released a lock on $DLOCK_TEST_ZK_URL"
        fi
        # pkg-config: libdlock_zk.a beside whichever libdlock the linker picks.
        flags=$(pkg-config --cflags --libs dlock-zk) || fail "pkg-config --cflags --libs dlock-zk"
        # shellcheck disable=SC2086 # the flags are words
        cc -std=c11 -Wall -Wextra -Werror -DBACKEND=zk -o "$work/app-zk-pc" \
            "$work/static-app/app.c" $flags || fail "app.c does not build with pkg-config dlock-zk ($flags)"
        run_static "app-zk-pc" 1 env LD_LIBRARY_PATH="$libdir" "$work/app-zk-pc" "zk://127.0.0.1:1/x"
        ok "app.c builds with pkg-config dlock-zk: $flags"
        ;;
    esac
    # A libdlock.so that a program dlopen()s with RTLD_LOCAL lends a module
    # none of its calls either: the message says so.
    cat >"$work/local.c" <<'C'
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    int (*open_client)(void **, const char *, const void *);
    const char *(*message)(void);
    void *c = NULL;

    if (argc < 3 || lib == NULL)
        return 64;
    *(void **)&open_client = dlsym(lib, "dlock_client_open");
    *(void **)&message = dlsym(lib, "dlock_error_message");
    if (open_client == NULL || message == NULL)
        return 64;
    if (open_client(&c, argv[2], NULL) == 0)
        return 0;
    printf("open: %s\n", message());
    return 2;
}
C
    cc -std=c11 -Wall -Wextra -Werror -o "$work/local" "$work/local.c" -ldl || fail "local.c does not build"
    for so in "$libdir"/dlock/*.so; do
        [ -e "$so" ] || continue
        mod=$(basename "$so" .so)
        run_static "libdlock.so with RTLD_LOCAL" 2 "$work/local" "$libdir/libdlock.so" "$mod://127.0.0.1:1/x"
        echo "$out" | grep -Fq "libdlock.so was loaded with RTLD_LOCAL" ||
            fail "libdlock.so with RTLD_LOCAL, $mod://: not told why: $out"
        ok "a libdlock.so loaded with RTLD_LOCAL says why it loads no $mod module"
        run_static "app-rdynamic" 1 env DLOCK_MODULE_DIR="$libdir/dlock" \
            "$work/static-app/build/app-rdynamic" "$mod://127.0.0.1:1/x"
        ok "a program linked with libdlock.a and -rdynamic loads the $mod module"
    done
fi
echo "check_install: all passed"
