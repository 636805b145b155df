// Reads one revision's conformance results (the `checks.json` files that
// `conformance server -o DIR` writes), prints a short summary and judges them
// against conformance/expected-failures.yaml.
//
// The suite itself applies the baseline to the revision's *scored* scenarios only;
// this check applies the same rules to every scenario that ran, the not-scored ones
// too (server-session-lifecycle, server-sse-polling, http-header-validation, ...),
// so a regression there fails the run as well. Rules, as in the suite:
//   - a FAILURE or WARNING check not in the baseline is an unexpected failure;
//   - a baselined check that now passes is a stale entry (remove it);
//   - a baselined check that is absent or skipped is tolerated;
//   - repeated check ids collapse to their most severe status.
// Also an error: a scenario of the revision that wrote no results, and a baseline
// entry naming a scenario that no requirement set of this suite version knows.
//
// Usage: node check-results.mjs --suite-pkg DIR --revision REV --baseline FILE --results DIR
// Exit status: 0 when nothing is unexpected or stale, 1 otherwise, 2 on bad input.

import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';

function die(msg) {
  console.error(`check-results: ${msg}`);
  process.exit(2);
}

const args = {};
for (let i = 2; i < process.argv.length; i += 2) {
  const key = process.argv[i];
  if (!key.startsWith('--') || i + 1 >= process.argv.length) die(`bad argument ${key}`);
  args[key.slice(2)] = process.argv[i + 1];
}
for (const k of ['suite-pkg', 'revision', 'baseline', 'results']) {
  if (!args[k]) die(`--${k} is required`);
}

// The suite ships the `yaml` package; use it rather than installing another.
const YAML = createRequire(path.resolve(args['suite-pkg'], 'package.json'))('yaml');
const readYaml = (file) => YAML.parse(fs.readFileSync(file, 'utf8')) ?? {};

// What the revision runs: scored (`server`) and run-but-not-scored (`not_scored`, leg server).
const reqDir = path.join(args['suite-pkg'], 'requirements');
const reqFile = path.join(reqDir, `${args.revision}.yaml`);
if (!fs.existsSync(reqFile)) die(`no requirement set ${args.revision} in ${reqDir}`);
const serverScenarios = (req) => ({
  scored: req.server ?? [],
  notScored: (req.not_scored ?? []).filter((e) => e.leg === 'server').map((e) => e.scenario),
});
const req = serverScenarios(readYaml(reqFile));
const scored = new Set(req.scored);
const expectedToRun = [...req.scored, ...req.notScored];

// Every server scenario any revision of this suite version knows (to catch typos).
const known = new Set();
for (const f of fs.readdirSync(reqDir).filter((f) => f.endsWith('.yaml'))) {
  const r = serverScenarios(readYaml(path.join(reqDir, f)));
  [...r.scored, ...r.notScored].forEach((s) => known.add(s));
}

// Baseline entries: `scenario` (whole scenario) or `scenario:check-id`.
const baselineList = readYaml(args.baseline).server ?? [];
if (!Array.isArray(baselineList)) die(`${args.baseline}: 'server' must be a list`);
const wholeScenario = new Set();
const perCheck = new Map();
const problems = [];
for (const entry of baselineList) {
  if (typeof entry !== 'string') die(`${args.baseline}: entry ${JSON.stringify(entry)} is not a string`);
  const colon = entry.indexOf(':');
  const scenario = colon < 0 ? entry : entry.slice(0, colon);
  if (!known.has(scenario)) problems.push(`baseline entry '${entry}': no such server scenario`);
  if (colon < 0) wholeScenario.add(scenario);
  else {
    if (!perCheck.has(scenario)) perCheck.set(scenario, new Set());
    perCheck.get(scenario).add(entry.slice(colon + 1));
  }
}

// Results: DIR/server-<scenario>-<timestamp>/checks.json
const results = new Map();
const dirRe = /^server-(.+)-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{3}Z$/;
for (const d of fs.existsSync(args.results) ? fs.readdirSync(args.results) : []) {
  const m = dirRe.exec(d);
  const file = path.join(args.results, d, 'checks.json');
  if (!m || !fs.existsSync(file)) continue;
  const checks = JSON.parse(fs.readFileSync(file, 'utf8'));
  results.set(m[1], [...(results.get(m[1]) ?? []), ...checks]);
}

const severity = (s) => ({ FAILURE: 3, WARNING: 2, SUCCESS: 1 })[s] ?? 0;
const failing = (s) => s === 'FAILURE' || s === 'WARNING';

const count = {
  scored: { pass: 0, fail: 0 },
  notScored: { pass: 0, fail: 0 },
  checks: { SUCCESS: 0, FAILURE: 0, WARNING: 0, SKIPPED: 0 },
  expected: 0,
};
const unexpected = [];
const stale = [];
const passed = [];

for (const scenario of expectedToRun) {
  const checks = results.get(scenario);
  const bucket = scored.has(scenario) ? count.scored : count.notScored;
  if (!checks) {
    bucket.fail++;
    unexpected.push(`${scenario}: no results written (scenario crashed or was not run)`);
    continue;
  }
  for (const c of checks) if (c.status in count.checks) count.checks[c.status]++;
  // Collapse repeated ids to the most severe status.
  const worst = new Map();
  for (const c of checks) {
    if (c.status === 'INFO') continue;
    const prev = worst.get(c.id);
    if (!prev || severity(c.status) >= severity(prev.status)) worst.set(c.id, c);
  }
  const failed = [...worst.values()].filter((c) => failing(c.status));
  if (failed.length) bucket.fail++;
  else {
    bucket.pass++;
    passed.push(scenario);
  }

  if (wholeScenario.has(scenario)) {
    if (failed.length) count.expected += failed.length;
    else stale.push(`${scenario} (whole scenario now passes)`);
    continue;
  }
  const allowed = perCheck.get(scenario) ?? new Set();
  for (const c of failed) {
    if (allowed.has(c.id)) count.expected++;
    else unexpected.push(`${scenario}:${c.id} [${c.status}] ${c.errorMessage ?? c.description ?? ''}`.trim());
  }
  for (const id of allowed) {
    if (worst.get(id)?.status === 'SUCCESS') stale.push(`${scenario}:${id}`);
  }
}

const rev = args.revision;
const s = count.scored;
const n = count.notScored;
const c = count.checks;
console.log(
  `${rev}: scenarios scored ${s.pass} passed, ${s.fail} failed (of ${s.pass + s.fail}); ` +
    `not scored ${n.pass} passed, ${n.fail} failed (of ${n.pass + n.fail})`,
);
console.log(
  `${rev}: checks ${c.SUCCESS} passed, ${c.FAILURE} failed, ${c.WARNING} warnings, ${c.SKIPPED} skipped; ` +
    `baseline: ${count.expected} expected, ${unexpected.length} unexpected, ${stale.length} stale`,
);
console.log(`  passed: ${passed.join(', ') || '(none)'}`);
for (const p of problems) console.log(`  ! ${p}`);
for (const u of unexpected) console.log(`  ✗ unexpected: ${u}`);
for (const t of stale) console.log(`  ✓ stale baseline entry (now passes, remove it): ${t}`);
process.exit(unexpected.length || stale.length || problems.length ? 1 : 0);
