// Precompile the pinned wheels' Python for Pyodide: live mode's cold start spends most of its
// import of plotly compiling sources to bytecode (about 5x the import itself). This runs Pyodide in
// Node, unpacks the wheels, imports what a panel imports and draws one figure of each trace kind
// the book's panels use, then writes the bytecode of every module so loaded (unchecked-hash .pyc
// files in their __pycache__ folders, paths relative to site-packages) into one zip. The page's
// worker unpacks it over the wheels; a module missing from it is compiled from source as usual.
//
// Usage: node scripts/live_bytecode.mjs ASSETS_DIR OUT_ZIP   (scripts/live_assets.py runs it)
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [assets, out] = process.argv.slice(2).map((p) => resolve(p));
const { loadPyodide } = await import(pathToFileURL(join(assets, "pyodide", "pyodide.mjs")).href);
const pyodide = await loadPyodide({ indexURL: join(assets, "pyodide") + "/", packages: [] });
const site = pyodide.runPython("import site; site.getsitepackages()[0]");
for (const f of readdirSync(join(assets, "wheels")).filter((f) => f.endsWith(".whl"))) {
  pyodide.unpackArchive(new Uint8Array(readFileSync(join(assets, "wheels", f))), "wheel", { extractDir: site });
}
const n = pyodide.runPython(`
import importlib.util, py_compile, sys, zipfile
import plotly.graph_objects as go, plotly.io as pio
from plotly.subplots import make_subplots
from plotly.io.base_renderers import MimetypeRenderer
pio.templates.default = "plotly_white"
fig = make_subplots(rows=2, cols=1, specs=[[{"type": "table"}], [{"type": "xy"}]])
fig.add_trace(go.Table(header=dict(values=["a"]), cells=dict(values=[[1]])), row=1, col=1)
for trace in (go.Bar(x=[1], y=["a"], orientation="h"), go.Scatter(x=[1], y=[1], mode="lines+markers+text"),
              go.Heatmap(z=[[1]], text=[["a"]], texttemplate="%{text}")):
    fig.add_trace(trace, row=2, col=1)
fig.add_shape(type="rect", x0=0, x1=1, y0=0, y1=1)
bar = go.Figure(go.Bar(x=[1], y=["a"], orientation="h"))
bar.add_vline(x=1, annotation_text="a")
pio.to_json(bar, engine="json", validate=False)
fig.update_layout(sliders=[dict(steps=[dict(method="update", args=[{}])])],
                  updatemenus=[dict(buttons=[dict(method="update", args=[{}])])], legend=dict(orientation="h"))
fig.update_xaxes(ticksuffix=" x"); fig.update_yaxes(type="log")
pio.to_json(fig, engine="json", validate=False)
with zipfile.ZipFile("/tmp/bytecode.zip", "w", zipfile.ZIP_DEFLATED) as z:
    count = 0
    for name, m in sorted(sys.modules.items()):
        src = getattr(m, "__file__", None) or ""
        if src.startswith("${site}/") and src.endswith(".py"):
            pyc = importlib.util.cache_from_source(src)
            py_compile.compile(src, cfile=pyc, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
            z.write(pyc, pyc[len("${site}/"):])
            count += 1
count`);
writeFileSync(out, pyodide.FS.readFile("/tmp/bytecode.zip"));
console.log(`live_bytecode: ${n} modules precompiled into ${out}`);
