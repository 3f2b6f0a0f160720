// The browser edition's Web Worker: Pyodide, the pinned wheels, and paged_kv.panels.worker.
//
// Everything comes from this site's _static/live/ folder (book/_ext/live_mode.py puts it there):
// Pyodide's core files in pyodide/, the wheels listed in manifest.json in wheels/. A wheel is
// unpacked straight into site-packages (no micropip, no package index, no CDN), then the
// precompiled bytecode of the wheels and of the package (bytecode.zip, if the build has it; made
// by scripts/live_bytecode.mjs for this build's pure wheel) over them.
// Messages in: {id, cmd: "create", name, args} | {id, cmd: "act", handle, action}; out:
// {id, ok: true, result: <JSON text of paged_kv.panels.worker's reply>, ms} | {id, ok: false, error}.
import { loadPyodide } from "./pyodide/pyodide.mjs";

const here = new URL("./", import.meta.url);
let ready = null;

async function boot() {
  const t0 = performance.now();
  const manifest = await (await fetch(new URL("manifest.json", here))).json();
  const get = async (path) => {
    const r = await fetch(new URL(path, here));
    if (!r.ok) throw new Error(`fetching ${path}: HTTP ${r.status}`);
    return r.arrayBuffer();
  };
  const [pyodide, wheels, bytecode] = await Promise.all([
    loadPyodide({ indexURL: new URL("pyodide/", here).href, packages: [] }),
    Promise.all(manifest.wheels.map((w) => get("wheels/" + w.file))),
    manifest.bytecode ? get(manifest.bytecode) : null,
  ]);
  const t1 = performance.now();
  const site = pyodide.runPython("import site; site.getsitepackages()[0]");
  for (const buf of wheels) pyodide.unpackArchive(buf, "wheel", { extractDir: site });
  if (bytecode) pyodide.unpackArchive(bytecode, "zip", { extractDir: site });
  const t2 = performance.now();
  const worker = pyodide.pyimport("paged_kv.panels.worker");
  const t3 = performance.now();
  // where a cold start goes: Pyodide loaded and the wheels fetched, unpacked, the package imported
  const phases = { load: t1 - t0, unpack: t2 - t1, import: t3 - t2 };
  return { pyodide, worker, bootMs: t3 - t0, boot: phases };
}

// After a panel's first figure is posted, the worker replays the panel's demo session, thrown
// away (paged_kv.panels.worker.warm: nothing the reader sees changes), one step per task, so that
// the reader's first action finds its code paths warm. The panel's first action ends its warm-up;
// an action that arrives during a step waits for that step only.
let warming = false;
function warmSoon(worker) {
  if (warming) return;
  warming = true;
  setTimeout(() => {
    warming = false;
    let more = false;
    try {
      more = worker.warm();
    } catch (err) {
      console.warn(`live mode: warming up failed: ${err && err.message || err}`);
    }
    if (more) warmSoon(worker);
  }, 0);
}

self.onmessage = async (e) => {
  const m = e.data;
  try {
    ready = ready || boot();
    const { worker, bootMs, boot: phases } = await ready;
    const t0 = performance.now();
    const result = m.cmd === "create" ? worker.create(m.name, m.args || "{}")
      : m.cmd === "act" ? worker.act(m.handle, m.action)
      : (() => { throw new Error(`unknown command ${m.cmd}`); })();
    self.postMessage({ id: m.id, ok: true, result, ms: performance.now() - t0, bootMs, boot: phases });
    if (m.cmd === "create") warmSoon(worker);
  } catch (err) {
    self.postMessage({ id: m.id, ok: false, error: String(err && err.message || err) });
  }
};
