// SPDX-License-Identifier: BSD-3-Clause
// npm install's build step: node-gyp rebuild, with the headers of the Node
// that runs it when they are installed beside it (Debian's nodejs ships
// /usr/include/node), so that node-gyp need not download them: the build
// works offline.
'use strict';

const { spawnSync } = require('child_process');
const path = require('path');
const fs = require('fs');

const prefix = path.resolve(path.dirname(process.execPath), '..');
const args = ['rebuild'];
if (!process.env.npm_config_nodedir &&
    fs.existsSync(path.join(prefix, 'include', 'node', 'node_api.h')))
  args.push(`--nodedir=${prefix}`);
const gyp = require.resolve('node-gyp/bin/node-gyp.js');
const r = spawnSync(process.execPath, [gyp, ...args], { stdio: 'inherit' });
process.exit(r.status === null ? 1 : r.status);
