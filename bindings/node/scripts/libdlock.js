// SPDX-License-Identifier: BSD-3-Clause
// Where binding.gyp finds libdlock: `node scripts/libdlock.js include|libs`.
//   DLOCK_BUILD=DIR   a CMake build of dlock (DIR/libdlock.so, DIR/include,
//                     and the headers of the source tree it was built from);
//   else pkg-config's dlock (an installed libdlock, or PKG_CONFIG_PATH).
// The library's folder goes in the addon's run path, so the addon loads the
// libdlock it was built against.
'use strict';

const { execFileSync } = require('child_process');
const path = require('path');
const fs = require('fs');

function fail(why) {
  process.stderr.write(`dlock: ${why}\n`);
  process.exit(1);
}

function pkgConfig(args) {
  try {
    return execFileSync('pkg-config', args, { encoding: 'utf8' }).trim();
  } catch (e) {
    fail('libdlock not found: set DLOCK_BUILD to a CMake build of dlock, or install ' +
         'libdlock-dev (pkg-config dlock failed: ' + (e.code === 'ENOENT' ? 'no pkg-config' :
         String(e.stderr || e.message).trim()) + ')');
  }
}

const what = process.argv[2];
const build = process.env.DLOCK_BUILD;
if (build) {
  const dir = path.resolve(build);
  if (!fs.existsSync(path.join(dir, 'libdlock.so')))
    fail(`DLOCK_BUILD=${build}: no libdlock.so there (build it first: make build)`);
  // The headers are the source tree's (and the build's version.h): the
  // build's CMakeCache.txt names the tree, wherever this package sits.
  let src = null;
  try {
    const cache = fs.readFileSync(path.join(dir, 'CMakeCache.txt'), 'utf8');
    src = path.join(cache.match(/^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$/m)[1], 'include');
  } catch (e) {
    fail(`DLOCK_BUILD=${build}: not a CMake build of dlock (no CMakeCache.txt naming its source)`);
  }
  if (what === 'include')
    console.log([src, path.join(dir, 'include')].join(' '));
  else
    console.log(`-L${dir} -ldlock -Wl,-rpath,${dir}`);
} else if (what === 'include') {
  console.log(pkgConfig(['--cflags-only-I', 'dlock']).split(/\s+/)
    .filter((f) => f).map((f) => f.replace(/^-I/, '')).join(' '));
} else {
  const libdir = pkgConfig(['--variable=libdir', 'dlock']);
  console.log(`${pkgConfig(['--libs', 'dlock'])} -Wl,-rpath,${libdir}`);
}
