// Precompile live mode's Python for Pyodide, so that the reader's first click does not compile
// plotly and the package from source (compiling cost about 5x plotly's import itself). This runs
// Pyodide in Node (so the bytecode has the magic number of Pyodide's own CPython), unpacks the
// pinned wheels and the pure wheel into site-packages as the page's worker does, imports the
// worker and runs every registry panel's demo session (create, each demo action, its warm-up), so
// that every module a panel loads is loaded, then writes one zip of .pyc files in their
// __pycache__ folders, paths relative to site-packages, which the worker unpacks over the wheels:
//
// * the pinned wheels' modules that were loaded: unchecked-hash .pyc (their sources are pinned by
//   sha256 in lock.json and never change under them);
// * every module of the pure wheel, loaded or not: checked-hash .pyc. Python compares each with
//   the hash of the source it sits next to and compiles that source instead when they differ, so
//   a .pyc of other sources is never run (scripts/live_assets.py also makes a new zip for every
//   other pure wheel).
//
// A module missing from the zip is compiled from source in the browser as usual.
//
// Usage: node scripts/live_bytecode.mjs ASSETS_DIR PURE_WHEEL OUT_ZIP   (scripts/live_assets.py runs it)
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [assets, pureWheel, out] = process.argv.slice(2).map((p) => resolve(p));
if (!assets || !pureWheel || !out) {
  console.error("usage: node scripts/live_bytecode.mjs ASSETS_DIR PURE_WHEEL OUT_ZIP");
  process.exit(2);
}
const { loadPyodide } = await import(pathToFileURL(join(assets, "pyodide", "pyodide.mjs")).href);
const pyodide = await loadPyodide({ indexURL: join(assets, "pyodide") + "/", packages: [] });
const site = pyodide.runPython("import site; site.getsitepackages()[0]");
const wheels = readdirSync(join(assets, "wheels")).filter((f) => f.endsWith(".whl")).map((f) => join(assets, "wheels", f));
for (const w of [...wheels, pureWheel]) {
  pyodide.unpackArchive(new Uint8Array(readFileSync(w)), "wheel", { extractDir: site });
}
pyodide.globals.set("SITE", site);
const n = pyodide.runPython(`
import importlib.util, json, os, py_compile, sys, zipfile
from paged_kv.panels import registry, worker

for name in registry.available():          # a panel that does not import here is left out
    r = json.loads(worker.create(name, "{}"))
    for action in registry.panel_class(name).demo_actions:
        worker.warm()
        worker.act(r["handle"], json.dumps(action))
    worker.forget(r["handle"])
while worker.warm():
    pass

prefix = SITE + "/"
own = sorted(os.path.join(d, f) for d, _, files in os.walk(prefix + "paged_kv") for f in files if f.endswith(".py"))
loaded = sorted({m.__file__ for m in list(sys.modules.values()) if (getattr(m, "__file__", None) or "").endswith(".py")
                 and m.__file__.startswith(prefix) and not m.__file__.startswith(prefix + "paged_kv/")})
mode = py_compile.PycInvalidationMode
with zipfile.ZipFile("/tmp/bytecode.zip", "w", zipfile.ZIP_DEFLATED) as z:
    for sources, how in ((loaded, mode.UNCHECKED_HASH), (own, mode.CHECKED_HASH)):
        for src in sources:
            pyc = importlib.util.cache_from_source(src)
            py_compile.compile(src, cfile=pyc, doraise=True, invalidation_mode=how)
            z.write(pyc, pyc[len(prefix):])
f"{len(loaded)} modules of the pinned wheels and {len(own)} of the pure wheel"`);
writeFileSync(out, pyodide.FS.readFile("/tmp/bytecode.zip"));
console.log(`live_bytecode: ${n} precompiled into ${out}`);
