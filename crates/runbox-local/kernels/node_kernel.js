// runbox's JavaScript kernel driver: one persistent Node.js context per sandbox.
//
// Started by runbox inside the sandbox as `node --expose-internals node_kernel.js`, with
// fd 0 = /dev/null, fd 1 and fd 2 = pipes read by runbox, fd 3 = the control socket.
// The protocol is the Python driver's (see python_kernel.py): framed requests in, JSON
// lines out, a per-run marker on fd 1 and fd 2 after the run's output.
//
// Code runs in the kernel's own global context (vm.runInThisContext), so `var`, functions,
// top-level `let`/`const`/`class` and globals persist between runs, and objects from
// `require`d modules belong to the same realm as the user's. Code with top-level `await`
// is rewritten the way Node's REPL does it (declarations hoisted so they persist) and its
// promise awaited. `--expose-internals` is what makes the REPL's rewriter reachable.
'use strict';

const net = require('net');
const util = require('util');
const vm = require('vm');
const { createRequire } = require('module');

let processTopLevelAwait = null;
try {
  ({ processTopLevelAwait } = require('internal/repl/await'));
} catch {
  // Without it, code with top-level await runs inside an async function (its declarations
  // do not persist); everything else is unaffected.
}

const stdoutWrite = process.stdout.write.bind(process.stdout);
const stderrWrite = process.stderr.write.bind(process.stderr);

globalThis.require = createRequire('/workspace/');
globalThis.__dirname = '/workspace';
globalThis.__filename = '/workspace/[eval]';

// Node defines some globals (`crypto`, the Web Crypto API) as getters without a setter, so
// `var crypto = require('crypto')`, or `import * as crypto from 'crypto'` (a `var` once
// rewritten), would silently keep the old value. Give each such global a setter that
// replaces it with what was assigned, as for any other global; reading stays lazy.
for (const name of Object.getOwnPropertyNames(globalThis)) {
  const d = Object.getOwnPropertyDescriptor(globalThis, name);
  if (d && d.get && !d.set && d.configurable) {
    Object.defineProperty(globalThis, name, {
      configurable: true,
      enumerable: d.enumerable,
      get: d.get,
      set(value) {
        Object.defineProperty(globalThis, name, {
          value,
          writable: true,
          configurable: true,
          enumerable: d.enumerable,
        });
      },
    });
  }
}

let current = null; // { interrupt(): void } while a run is awaiting

process.on('SIGINT', () => {
  if (current) current.interrupt();
});
// A callback that throws after its run has ended must not take the kernel down.
process.on('uncaughtException', (err) => {
  stderrWrite(`Uncaught ${util.inspect(err)}\n`);
});
process.on('unhandledRejection', (reason) => {
  stderrWrite(`Unhandled promise rejection: ${util.inspect(reason)}\n`);
});

const ctrl = new net.Socket({ fd: 3, readable: true, writable: true });

function send(obj) {
  ctrl.write(JSON.stringify(obj) + '\n');
}

class Interrupted extends Error {
  constructor() {
    super('interrupted: the run was stopped (timeout or cancellation)');
    this.name = 'Interrupted';
  }
}

function cleanStack(stack) {
  return String(stack)
    .split('\n')
    .filter((l) => !/\(node:|at node:|\/opt\/runbox\/|runInThisContext|processTicksAndRejections/.test(l))
    .join('\n');
}

function formatError(err) {
  if (err && err.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') err = new Interrupted();
  if (err instanceof Error || (err && typeof err === 'object' && 'message' in err)) {
    return {
      name: String(err.name || 'Error'),
      value: String(err.message),
      traceback: cleanStack(err.stack || `${err.name}: ${err.message}`),
    };
  }
  return { name: 'Uncaught', value: util.inspect(err), traceback: `Uncaught ${util.inspect(err)}` };
}

function applyEnv(pairs) {
  const saved = new Map();
  for (const pair of pairs) {
    const i = pair.indexOf('=');
    if (i <= 0) continue;
    const key = pair.slice(0, i);
    if (!saved.has(key)) saved.set(key, process.env[key]);
    process.env[key] = pair.slice(i + 1);
  }
  return saved;
}

function restoreEnv(saved) {
  for (const [key, value] of saved) {
    if (value === undefined) delete process.env[key];
    else process.env[key] = value;
  }
}

function interruptible(promise) {
  return new Promise((resolve, reject) => {
    current = { interrupt: () => reject(new Interrupted()) };
    promise.then(resolve, reject);
  }).finally(() => {
    current = null;
  });
}

async function run(cell, code, envPairs) {
  const filename = `<cell ${cell}>`;
  const saved = applyEnv(envPairs);
  let result = null;
  let error = null;
  try {
    let script;
    let wrapped = false;
    try {
      script = new vm.Script(code, { filename });
    } catch (err) {
      if (!(err instanceof SyntaxError) || !/\bawait\b/.test(code)) throw err;
      if (processTopLevelAwait) {
        // null: the code has no top-level await after all, or does not parse.
        const rewritten = processTopLevelAwait(code);
        if (rewritten === null) throw err;
        script = new vm.Script(rewritten, { filename });
        wrapped = 'repl';
      } else {
        script = new vm.Script(`(async () => {\n${code}\n})()`, { filename });
        wrapped = 'function';
      }
    }
    let value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (wrapped) {
      const settled = await interruptible(Promise.resolve(value));
      value = wrapped === 'repl' && settled !== undefined ? settled.value : undefined;
    }
    if (value !== undefined) {
      result = { 'text/plain': util.inspect(value, { depth: 4, colors: false }) };
    }
  } catch (err) {
    error = formatError(err);
  } finally {
    restoreEnv(saved);
  }
  return { result, error };
}

function drained(stream) {
  return stream.writableLength === 0 ? Promise.resolve() : new Promise((r) => stream.once('drain', r));
}

async function endRun(marker) {
  await Promise.all([drained(process.stdout), drained(process.stderr)]);
  stdoutWrite(marker);
  stderrWrite(marker);
  await Promise.all([drained(process.stdout), drained(process.stderr)]);
}

// Requests: b"run <marker> <code bytes> <env bytes>\n" + code + env.
let buffer = Buffer.alloc(0);
let queue = Promise.resolve();
let cell = 0;

function parse() {
  for (;;) {
    const nl = buffer.indexOf(10);
    if (nl < 0) return;
    const parts = buffer.subarray(0, nl).toString('latin1').split(' ');
    if (parts.length !== 4 || parts[0] !== 'run') {
      send({ type: 'fatal', message: 'malformed request' });
      process.exit(2);
    }
    const codeLen = Number(parts[2]);
    const envLen = Number(parts[3]);
    const total = nl + 1 + codeLen + envLen;
    if (buffer.length < total) return;
    const marker = parts[1];
    const code = buffer.subarray(nl + 1, nl + 1 + codeLen).toString('utf8');
    const env = buffer.subarray(nl + 1 + codeLen, total).toString('utf8').split('\0').filter(Boolean);
    buffer = buffer.subarray(total);
    cell += 1;
    const n = cell;
    queue = queue.then(async () => {
      const { result, error } = await run(n, code, env);
      await endRun(marker);
      send({ type: 'done', result, error, markers: true });
    });
  }
}

ctrl.on('data', (chunk) => {
  buffer = Buffer.concat([buffer, chunk]);
  parse();
});
ctrl.on('end', () => process.exit(0));
ctrl.on('error', () => process.exit(0));

send({ type: 'ready', version: process.version.replace(/^v/, ''), pid: process.pid });
