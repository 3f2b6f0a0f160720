// Parity in Node: run each registry panel's demo_actions in Pyodide and print the sha256 of the
// figure JSON after each step (the first: the panel's initial figure), one JSON object on the
// last line: {"<panel>": ["<sha256>", ...], ...}. tests/live/test_parity.py compares them with
// CPython's (which never warms up: the page's worker's warm-up before the first action must change
// nothing).
//
// Usage: node scripts/live_parity.mjs ASSETS_DIR PURE_WHEEL
//   ASSETS_DIR: what scripts/live_assets.py fetched (pyodide/ and wheels/)
import { readFileSync, readdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [assets, pureWheel] = process.argv.slice(2).map((p) => resolve(p));
if (!assets || !pureWheel) {
  console.error("usage: node scripts/live_parity.mjs ASSETS_DIR PURE_WHEEL");
  process.exit(2);
}
const { loadPyodide } = await import(pathToFileURL(join(assets, "pyodide", "pyodide.mjs")).href);
const pyodide = await loadPyodide({ indexURL: join(assets, "pyodide") + "/", packages: [] });
const site = pyodide.runPython("import site; site.getsitepackages()[0]");
const wheels = readdirSync(join(assets, "wheels")).filter((f) => f.endsWith(".whl")).map((f) => join(assets, "wheels", f));
for (const w of [...wheels, pureWheel]) pyodide.unpackArchive(new Uint8Array(readFileSync(w)), "wheel", { extractDir: site });
// No numpy or torch here: a panel that needs them fails to import and is left out (and reported).
const worker = pyodide.pyimport("paged_kv.panels.worker");
const registry = pyodide.pyimport("paged_kv.panels.registry");
const names = JSON.parse(pyodide.runPython("import json\nfrom paged_kv.panels import registry\njson.dumps(list(registry.PANELS))"));
const out = {}, skipped = {};
for (const name of names) {
  let cls;
  try {
    cls = registry.panel_class(name);
  } catch (err) {
    skipped[name] = String(err.message).split("\n").filter(Boolean).pop();
    continue;
  }
  const actions = JSON.parse(pyodide.runPython(`import json\nfrom paged_kv.panels import registry\njson.dumps(registry.panel_class(${JSON.stringify(name)}).demo_actions)`));
  let r = JSON.parse(worker.create(name, "{}"));
  const hashes = [r.figure_sha256];
  while (worker.warm());     // the whole warm-up, as the page's worker runs it before a first action
  for (const a of actions) {
    r = JSON.parse(worker.act(r.handle, JSON.stringify(a)));
    hashes.push(r.figure_sha256);
  }
  out[name] = hashes;
  cls.destroy();
}
console.error(`skipped: ${JSON.stringify(skipped)}`);
console.log(JSON.stringify(out));
