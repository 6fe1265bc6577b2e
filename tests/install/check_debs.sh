#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The Debian packages, as a packager builds them (.ci/run runs this):
#   tests/install/check_debs.sh [OUT_DIR]
# Copies the tracked files of this tree (with their changes) to a scratch
# folder, runs `dpkg-buildpackage -b -us -uc` there (no tests: they need
# servers, and run in CI), then checks
#   - lintian: no error and no warning on any package, the .changes and the
#     .buildinfo (and that a warning does fail the check);
#   - what each .deb holds (dpkg -c): the library package named after the
#     SONAME, the man pages each with its program, the guides in dlock-doc;
#   - the relations: libdlock0.1 and dlock depend on no database library,
#     dlock suggests the backend modules, libdlock-dev depends on the package
#     of every pkg-config module that dlock.pc requires;
# then unpacks them into a folder and builds programs against it: the
# README's example (check_install.sh --installed: pkg-config, CMake), and a
# program linked with libdlock.a, its flags from pkg-config. The .debs
# are left in OUT_DIR when given. Needs dpkg-dev, debhelper, lintian and the
# Build-Depends of debian/control (scripts/deps.sh installs them). Takes
# 2 to 10 minutes, most of it dpkg-buildpackage; lintian about 15 s.
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/dlock-debs-XXXXXX")
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT INT TERM
fail() { echo "check_debs: FAIL: $*" >&2; exit 1; }

mkdir "$work/dlock"
(cd "$src" && git ls-files -z --cached --others --exclude-standard |
    xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
    xargs -0 cp --parents -t "$work/dlock")
echo "== check_debs: dpkg-buildpackage -b -us -uc (log: $work/build.log while it runs)"
(cd "$work/dlock" && DEB_BUILD_OPTIONS="parallel=2 ${DEB_BUILD_OPTIONS:-}" \
    dpkg-buildpackage -b -us -uc >"$work/build.log" 2>&1) ||
    { tail -60 "$work/build.log" >&2
      grep -q "^dpkg-gensymbols: error" "$work/build.log" &&
          fail "dpkg-buildpackage: symbols of debian/libdlock*.symbols are gone from the library (above): an ABI break"
      fail "dpkg-buildpackage"; }

# Every package of debian/control, each built; the library's is named
# after its SONAME (libdlock.so.0.1 -> libdlock0.1).
packages=$(sed -n 's/^Package: *//p' "$src/debian/control")
libpkg=$(echo "$packages" | grep -E '^libdlock[0-9]') || fail "no libdlockN package in debian/control"
deb() { # package -> its .deb
    f=$(ls "$work"/"$1"_*.deb 2>/dev/null | head -1)
    [ -n "$f" ] || fail "no $1 package was built"
    echo "$f"
}
for p in $packages; do deb "$p" >/dev/null; done

# ---- lintian: no error, no warning ----
# On the .changes: every .deb (the -dbgsym ones too) and the .buildinfo.
# Informational tags (I:) are shown, not counted.
command -v lintian >/dev/null || fail "lintian is not installed (apt-get install lintian; scripts/deps.sh installs it)"
lint() { # files... -> lintian's output in $work/lintian.log, its status
    lintian --fail-on error,warning --display-info --tag-display-limit 0 "$@" >"$work/lintian.log" 2>&1
}
echo "== check_debs: lintian"
changes=$(ls "$work"/*.changes)
if ! lint "$changes"; then
    grep -E '^[EW]:' "$work/lintian.log" >&2 || cat "$work/lintian.log" >&2
    fail "lintian reports errors or warnings (above)"
fi
grep -E '^[IPX]:' "$work/lintian.log" | sed 's/^/    /' || true
# The gate can close: dlock-demo without its man page is a warning
# (no-manual-page), and a warning fails lint.
dpkg-deb -R "$(deb dlock-demo)" "$work/broken"
rm -f "$work"/broken/usr/share/man/man1/dlock-demo.1*
sed -i '/dlock-demo\.1/d' "$work/broken/DEBIAN/md5sums"
dpkg-deb --root-owner-group -b "$work/broken" "$work/broken.deb" >/dev/null
lint "$work/broken.deb" && fail "lintian passed dlock-demo without its man page"
grep -q '^W: dlock-demo: no-manual-page' "$work/lintian.log" ||
    { cat "$work/lintian.log" >&2; fail "lintian did not warn no-manual-page for dlock-demo without its man page"; }
echo "check_debs: ok: lintian: no error, no warning ($(echo "$packages" | wc -w) packages, .changes, .buildinfo)"

# debian/LIBPKG.symbols lists the library's exported symbols, each with the
# version that brought it. A symbol gone fails dpkg-buildpackage (an ABI
# break: a new SONAME and package name); a new one is only a warning of
# dpkg-gensymbols, shown here: add it to the file with the version it first
# ships in.
if grep -q "^dpkg-gensymbols: warning" "$work/build.log"; then
    echo "check_debs: note: new symbols, not in debian/$libpkg.symbols yet:"
    sed -n '/^dpkg-gensymbols: warning/,/^ *dh_/p' "$work/build.log" | grep '^+ ' | sed 's/^+/   /'
fi

# ---- what each package holds ----
has() { # package path-regex what
    dpkg -c "$(deb "$1")" | awk '{ print $6 }' | grep -Eq "$2" || fail "$1 has no $3"
}
hasnt() {
    dpkg -c "$(deb "$1")" | awk '{ print $6 }' | grep -Eq "$2" && fail "$1 holds $3"
    return 0
}
soname_re=$(echo "$libpkg" | sed 's/^libdlock//; s/\./\\./g')
has "$libpkg" "/usr/lib/[^/]+/libdlock\\.so\\.$soname_re\$" "the SONAME link libdlock.so.${libpkg#libdlock}"
hasnt "$libpkg" '\.a$|\.pc$|/include/' "development files"
has libdlock-dev '/usr/include/dlock/dlock\.h$' "dlock.h"
has libdlock-dev '/usr/include/dlock/version\.h$' "version.h"
has libdlock-dev '/usr/include/dlock/sys/backend\.h$' "sys/backend.h"
has libdlock-dev '/usr/include/dlock/async\.h$' "async.h"
has libdlock-dev '/usr/include/dlock/adapters/libuv\.h$' "adapters/libuv.h"
has libdlock-dev '/usr/include/dlock/adapters/libevent\.h$' "adapters/libevent.h"
has libdlock-dev '/usr/lib/[^/]+/libdlock\.a$' "libdlock.a"
has libdlock-dev '/usr/lib/[^/]+/libdlock\.so$' "the libdlock.so link"
has libdlock-dev '/usr/lib/[^/]+/pkgconfig/dlock\.pc$' "dlock.pc"
has libdlock-dev '/usr/lib/[^/]+/cmake/dlock/dlockConfig\.cmake$' "dlockConfig.cmake"
has dlock '/usr/bin/dlock$' "/usr/bin/dlock"
hasnt dlock 'dlock-demo' "the demo"
has dlock-demo '/usr/bin/dlock-demo$' "/usr/bin/dlock-demo"
has dlock-doc '/usr/share/doc/dlock/README\.md$' "the README"
for guide in "$src"/docs/*.md; do
    has dlock-doc "/usr/share/doc/dlock/docs/$(basename "$guide")\$" "docs/$(basename "$guide")"
done
# Each backend module in a package of its own, so that the library and
# dlock depend on no database library; dlock suggests them.
suggests=$(dpkg-deb -f "$(deb dlock)" Suggests)
for mod in zk postgres mysql; do
    has dlock-backend-$mod "/usr/lib/[^/]+/dlock/$mod\\.so\$" "the $mod module"
    hasnt "$libpkg" "/dlock/$mod\\.so\$" "the $mod module"
    echo "$suggests" | grep -q "dlock-backend-$mod" || fail "dlock does not suggest dlock-backend-$mod: $suggests"
done
lib_depends=$(dpkg-deb -f "$(deb "$libpkg")" Depends)
echo "$lib_depends" | grep -Eq 'libpq|libzookeeper|libmariadb' && fail "$libpkg depends on a database library: $lib_depends"
# Every man page with its program: section 3 in libdlock-dev, NAME.1 in the
# package of /usr/bin/NAME.
for page in "$src"/man/*.scd; do
    [ -e "$page" ] || continue
    name=$(basename "$page" .scd)
    section=${name##*.}
    pkg=libdlock-dev
    if [ "$section" != 3 ]; then
        pkg=
        for p in $packages; do
            dpkg -c "$(deb "$p")" | awk '{ print $6 }' | grep -Eq "/usr/bin/${name%.*}\$" && pkg=$p
        done
        [ -n "$pkg" ] || fail "man/$name.scd: no package has /usr/bin/${name%.*}"
    fi
    has "$pkg" "/usr/share/man/man$section/$name(\\.gz)?$" "the man page $name"
done
depends=$(dpkg-deb -f "$(deb dlock)" Depends)
echo "$depends" | grep -q "$libpkg" || fail "dlock does not depend on $libpkg: $depends"
echo "$depends" | grep -Eq 'libpq|libsqlite' && fail "dlock depends on a database library: $depends"
for p in $packages; do
    echo "-- $(basename "$(deb "$p")"): $(dpkg -c "$(deb "$p")" | awk '$6 !~ /\/$/ { print $6 }' | grep -v '/usr/share/doc/' | tr '\n' ' ')"
done

# A user's program against the packages' files, unpacked into a folder
# (not installed: the machine's /usr stays as it is).
for p in $packages; do
    dpkg -x "$(deb "$p")" "$work/root"
done
pc=$(ls "$work"/root/usr/lib/*/pkgconfig/dlock.pc)
libdir=$(dirname "$(dirname "$pc")")

# libdlock-dev depends on the package of each pkg-config module dlock.pc
# requires (privately too: `pkg-config --static --libs dlock` and, with
# pkg-config, even `--cflags dlock` need them), so that installing it is
# enough. Each module's .pc is looked up on this machine, its owner with dpkg.
dev_depends=$(dpkg-deb -f "$(deb libdlock-dev)" Depends | tr -s ',| ' '\n')
requires=
for m in $(sed -n 's/^Requires\(\.private\)\{0,1\}: *//p' "$pc" | tr ',' ' '); do
    case "$m" in [\<\>=0-9]*) continue ;; esac # a version constraint
    requires="$requires $m"
    path=$(pkg-config --path "$m") || fail "dlock.pc requires $m: no $m.pc on this machine"
    owner=$(dpkg -S "$path" | sed 's/[:,].*//')
    echo "$dev_depends" | grep -qx "$owner" ||
        fail "dlock.pc requires $m ($owner), and libdlock-dev does not depend on $owner"
    echo "check_debs: ok: dlock.pc requires $m: libdlock-dev depends on $owner"
done

sh "$src/tests/install/check_install.sh" "$src" --installed "$work/root/usr" ||
    fail "the unpacked packages do not work as an installed dlock"

# A program linked with libdlock.a, the rest shared, its flags from
# pkg-config: both built-in backends reached (Redis: hiredis, OpenSSL; etcd:
# libcurl, jansson, protobuf-c), each failing to connect to port 1.
# `pkg-config --static --libs dlock` must resolve (every module it requires
# installed with libdlock-dev), but its flags do not link on Debian:
# libcurl.pc names its own private libraries (-lnghttp2, -lssh2, ...), whose
# -dev packages libcurl4-openssl-dev only suggests. So the program links
# libdlock.a and the shared libraries of the modules dlock.pc requires, as
# dlock::dlock_static does.
cat >"$work/static.c" <<'C'
#include <dlock/dlock.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    const char *urls[] = {"redis://127.0.0.1:1", "etcd://127.0.0.1:1"};
    dlock_client_options opts = DLOCK_CLIENT_OPTIONS_INIT;
    opts.connect_timeout_ms = 2000;
    if (strcmp(dlock_version(), DLOCK_VERSION) != 0)
        return 3;
    for (int i = 0; i < 2; i++) {
        dlock_client *client = NULL;
        int rc = dlock_client_open(&client, urls[i], &opts);
        printf("%s: %s\n", urls[i], dlock_strerror(rc));
        dlock_client_free(client);
        if (rc != DLOCK_ECONN)
            return 2;
    }
    return 0;
}
C
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pkg-config --static --libs dlock >/dev/null || fail "pkg-config --static --libs dlock"
cflags=$(pkg-config --cflags dlock) || fail "pkg-config --cflags dlock"
libs=$(pkg-config --libs dlock $requires) || fail "pkg-config --libs dlock $requires"
static_libs="$(echo " $libs " | sed 's| -ldlock | -l:libdlock.a |') -pthread"
# shellcheck disable=SC2086 # the flags are words
cc -std=c11 -Wall -Wextra -Werror -o "$work/static" "$work/static.c" $cflags $static_libs ||
    fail "a program does not link libdlock.a ($cflags $static_libs)"
readelf -d "$work/static" | grep -q 'NEEDED.*libdlock' && fail "the static program needs libdlock.so"
"$work/static" | sed 's/^/    /' || fail "the static program failed"
echo "check_debs: ok: a program links libdlock.a with pkg-config: $static_libs"
unset PKG_CONFIG_PATH

if [ -n "${1:-}" ]; then
    mkdir -p "$1"
    cp "$work"/*.deb "$1"/
fi
echo "check_debs: all passed"
