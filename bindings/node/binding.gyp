# SPDX-License-Identifier: BSD-3-Clause
# The addon, built by node-gyp (npm install) against libdlock: an in-tree
# build when DLOCK_BUILD names one, else the installed library found by
# pkg-config (scripts/libdlock.js says which, and why not).
{
  "targets": [
    {
      "target_name": "dlock",
      "sources": ["src/dlock_node.cc"],
      "include_dirs": [
        "<!(node -p \"require('node-addon-api').include_dir\")",
        "<!@(node scripts/libdlock.js include)"
      ],
      "libraries": ["<!@(node scripts/libdlock.js libs)"],
      "cflags_cc": ["-std=c++17", "-Wall", "-Wextra"],
      "defines": ["NAPI_VERSION=8"]
    }
  ]
}
