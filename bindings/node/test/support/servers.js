// SPDX-License-Identifier: BSD-3-Clause
// Real servers for the binding's tests: a redis-server and a one-member
// etcd, each started on free loopback ports in a temporary folder and
// stopped at the end (Debian's redis-server and etcd-server), and the
// ZooKeeper, PostgreSQL and MariaDB that scripts/test.sh starts for the
// suite, when their DLOCK_TEST_*_URL is set (make test sets them).
'use strict';

const { spawn } = require('child_process');
const fs = require('fs');
const net = require('net');
const os = require('os');
const path = require('path');
const http = require('http');

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function need(program, pkg) {
  for (const dir of (process.env.PATH || '').split(':').concat(['/usr/bin', '/usr/sbin'])) {
    const p = path.join(dir, program);
    if (fs.existsSync(p))
      return p;
  }
  throw new Error(`${program} is missing: apt-get install ${pkg}`);
}

async function waitUntil(check, what, seconds = 30) {
  const end = Date.now() + seconds * 1000;
  while (Date.now() < end) {
    if (await check())
      return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${what} did not come up within ${seconds} s`);
}

function redisUp(port) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1', () => s.write('PING\r\n'));
    s.setTimeout(200, () => { s.destroy(); resolve(false); });
    s.once('data', (d) => { s.destroy(); resolve(d.toString().startsWith('+PONG')); });
    s.once('error', () => resolve(false));
  });
}

function etcdUp(port) {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/health', timeout: 500 }, (res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve(body.includes('"true"')));
    });
    req.on('error', () => resolve(false));
    req.on('timeout', () => { req.destroy(); resolve(false); });
  });
}

// Starts what the suite needs; stop() ends it. Each server:
// { name, url, shortTtl (ms: a lease short enough to watch run out) }.
async function start() {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'dlock-node-'));
  const procs = [];
  const servers = [];

  const rport = await freePort();
  procs.push(spawn(need('redis-server', 'redis-server'), ['--port', String(rport), '--bind',
    '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', tmp], { stdio: 'ignore' }));
  await waitUntil(() => redisUp(rport), 'redis-server');
  servers.push({ name: 'redis', url: `redis://127.0.0.1:${rport}`, shortTtl: 500 });

  const cport = await freePort();
  const pport = await freePort();
  procs.push(spawn(need('etcd', 'etcd-server'), ['--name', 'node', '--data-dir',
    path.join(tmp, 'etcd'), '--listen-client-urls', `http://127.0.0.1:${cport}`,
    '--advertise-client-urls', `http://127.0.0.1:${cport}`, '--listen-peer-urls',
    `http://127.0.0.1:${pport}`, '--initial-advertise-peer-urls', `http://127.0.0.1:${pport}`,
    '--initial-cluster', `node=http://127.0.0.1:${pport}`, '--heartbeat-interval', '50',
    '--election-timeout', '500', '--logger', 'zap', '--log-level', 'error'],
  { stdio: 'ignore' }));
  await waitUntil(() => etcdUp(cport), 'etcd');
  servers.push({ name: 'etcd', url: `etcd://127.0.0.1:${cport}`, shortTtl: 1000 });

  for (const [name, env] of [['zk', 'DLOCK_TEST_ZK_URL'], ['postgres', 'DLOCK_TEST_POSTGRES_URL'],
    ['mysql', 'DLOCK_TEST_MYSQL_URL']]) {
    if (process.env[env])
      servers.push({ name, url: process.env[env], shortTtl: 1000 });
  }

  async function stop() {
    for (const p of procs) {
      if (p.exitCode === null) {
        const ended = new Promise((r) => p.once('exit', r));
        p.kill('SIGTERM');
        await ended;
      }
    }
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  return { servers, stop, redisPort: rport };
}

// A URL of the same scheme on a port where nothing listens.
async function closedPort(url) {
  const port = await freePort();
  if (url.startsWith('mysql://'))
    return url.replace(/@[^/]*\//, `@127.0.0.1:${port}/`);
  if (url.startsWith('postgres'))
    return url.replace(/@[^/]*\//, `@127.0.0.1:${port}/`);
  return url.replace(/\/\/([^/@]*@)?[^/,?]*/, `//$1127.0.0.1:${port}`);
}

module.exports = { start, freePort, closedPort, need };
