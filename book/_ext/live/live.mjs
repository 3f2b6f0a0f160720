// The live panels of a page: imported on the first "Run live" click (click.js).
//
// One Web Worker (worker.mjs) runs Pyodide and the package for every panel of the page. For a
// placeholder <div class="paged-kv-live" data-panel data-args data-figure> (paged_kv/panels/page.py)
// start() asks the worker to build the panel, redraws the page's figure in place (Plotly.react)
// with the figure JSON it answers, and draws the panel's controls from its controls() list; every
// control then sends its action and redraws. What the page shows after each step is recorded on the
// placeholder for the tests once Plotly.react has drawn it: data-live-state, data-live-steps,
// data-live-sha (the sha256 of the figure JSON, as CPython computes it), data-live-ms (the last
// call's time in the worker).
let worker = null;
let nextId = 1;
const pending = new Map();

function call(msg) {
  if (!worker) {
    worker = new Worker(new URL("worker.mjs", import.meta.url), { type: "module" });
    worker.onmessage = (e) => {
      const { id, ok, result, error, ms, bootMs, boot } = e.data;
      const p = pending.get(id);
      pending.delete(id);
      if (ok) p.resolve({ reply: JSON.parse(result), ms, bootMs, boot });
      else p.reject(new Error(error));
    };
    worker.onerror = (e) => {
      for (const p of pending.values()) p.reject(new Error(e.message || "the live worker failed"));
      pending.clear();
    };
  }
  const id = nextId++;
  return new Promise((resolve, reject) => {
    pending.set(id, { resolve, reject });
    worker.postMessage({ id, ...msg });
  });
}

function figureOf(box) {
  const id = box.dataset.figure;
  if (id && document.getElementById(id)) return document.getElementById(id);
  for (const gd of document.querySelectorAll(".plotly-graph-div")) {
    if (box.compareDocumentPosition(gd) & Node.DOCUMENT_POSITION_FOLLOWING) return gd;
  }
  const gd = document.createElement("div");
  gd.className = "plotly-graph-div";
  box.appendChild(gd);
  return gd;
}

async function draw(box, { reply, ms }) {
  const gd = figureOf(box);
  const { data, layout } = reply.figure;
  // the div takes the figure's own height: the page's keeps the first figure's (plotly's to_html
  // writes it into the style of the div or of a wrapper around it), which clipped a taller figure
  if (typeof layout.height === "number") {
    gd.style.height = `${layout.height}px`;
    const wrapper = gd.parentElement;
    if (wrapper && wrapper.style.height && !wrapper.classList.contains("paged-kv-live")) {
      wrapper.style.height = `${layout.height}px`;
    }
  }
  // the text and the data-live-* marks change once the figure is drawn: a test (or a reader)
  // that sees the new step's marks sees the new step's figure
  await window.Plotly.react(gd, data, layout, { displaylogo: false, responsive: true });
  const status = box.querySelector(".paged-kv-live-status");
  let note = box.querySelector(".paged-kv-live-refused");
  if (!note) {
    note = document.createElement("p");
    note.className = "paged-kv-live-refused";
    note.style.color = "#B00";
    status.before(note);
  }
  note.textContent = reply.note ? `refused: ${reply.note}` : "";   // the state, and the figure, stay
  note.style.display = reply.note ? "" : "none";
  if (reply.note) resetInputs(box, reply.values || {});
  status.style.display = "";
  status.textContent = reply.status;
  box.dataset.liveSha = reply.figure_sha256;
  box.dataset.liveNote = reply.note;
  box.dataset.liveMs = String(Math.round(ms));
  box.dataset.liveSteps = String(Number(box.dataset.liveSteps || -1) + 1);
}

// After a refusal the inputs show again the values the panel's state holds (the figure's), not
// the refused one: paged_kv.panels.base.PanelModel.input_values, the reply's "values".
function resetInputs(box, values) {
  for (const el of box.querySelectorAll(".paged-kv-live-controls select, .paged-kv-live-controls input")) {
    if (!(el.name in values)) continue;
    const v = values[el.name];
    if (el.tagName === "SELECT") el.selectedIndex = [...el.options].findIndex((o) => o.value === String(v));
    else el.value = v === null ? "" : String(v);
  }
}

function renderControls(box, controls, handle) {
  const holder = box.querySelector(".paged-kv-live-controls");
  holder.textContent = "";
  const inputs = [];
  let queue = Promise.resolve();
  // a button sends every input's value; an input's change (with an "auto" button) that input alone
  const send = (op, only) => {
    const action = { op };
    for (const { name, read } of inputs) if (only === undefined || name === only) action[name] = read();
    queue = queue.then(() => call({ cmd: "act", handle, action: JSON.stringify(action) }))
      .then((r) => draw(box, r))
      .catch((err) => { box.querySelector(".paged-kv-live-status").textContent = `failed: ${err.message}`; });
    return queue;
  };
  let auto = null;
  for (const c of controls) {
    const label = document.createElement("label");
    label.className = "paged-kv-live-control";
    label.style.cssText = "display:inline-block;margin:0 1em 0.4em 0;white-space:nowrap";
    if (c.kind === "button") {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = c.label;
      b.dataset.op = c.op;
      b.addEventListener("click", () => send(c.op));
      if (c.auto) auto = c.op;
      holder.appendChild(b);
      continue;
    }
    label.append(c.label + " ");
    let el;
    if (c.kind === "select") {
      el = document.createElement("select");
      c.options.forEach((o, i) => {
        const opt = document.createElement("option");
        opt.value = String(o);
        opt.textContent = c.labels ? c.labels[i] : String(o);   // a prompt's "\n" shows as ⏎
        if (o === c.value) opt.selected = true;
        el.appendChild(opt);
      });
      inputs.push({ name: c.name, read: () => c.options[el.selectedIndex] });   // the option itself, a number stays one
    } else {
      el = document.createElement("input");
      el.type = c.kind === "int" ? "number" : "text";
      if (c.min !== undefined) el.min = c.min;
      if (c.max !== undefined) el.max = c.max;
      el.value = c.value ?? "";
      // an empty number box is sent as null (Number("") is 0), which the panel refuses by name
      const number = () => (el.value.trim() === "" ? null : Number(el.value));
      inputs.push({ name: c.name, read: () => (c.kind === "int" ? number() : el.value) });
    }
    el.name = c.name;
    label.appendChild(el);
    holder.appendChild(label);
  }
  if (auto !== null) {
    for (const el of holder.querySelectorAll("select, input")) el.addEventListener("change", () => send(auto, el.name));
  }
}

export async function start(box) {
  if (box.dataset.liveState) return;
  box.dataset.liveState = "starting";
  const run = box.querySelector(".paged-kv-live-run");
  run.disabled = true;
  run.textContent = "Starting Python in your browser…";
  const t0 = performance.now();
  try {
    const r = await call({ cmd: "create", name: box.dataset.panel, args: box.dataset.args || "{}" });
    await draw(box, r);
    renderControls(box, r.reply.controls, r.reply.handle);
    box.dataset.liveColdMs = String(Math.round(performance.now() - t0));
    box.dataset.liveBootMs = String(Math.round(r.bootMs));
    box.dataset.liveBoot = JSON.stringify(r.boot);
    box.dataset.liveCreateMs = String(Math.round(r.ms));
    run.textContent = "Live";
    // the badge says the figure is now the live panel's (paged_kv.panels.page.LIVE_BADGE)
    const badge = box.querySelector(".paged-kv-live-badge");
    if (badge && badge.dataset.liveBadge) {
      badge.textContent = badge.dataset.liveBadge;
      badge.classList.add("paged-kv-live-badge-on");
    }
    box.dataset.liveState = "ready";
  } catch (err) {
    delete box.dataset.liveState;
    run.disabled = false;
    run.textContent = "Run live (try again)";
    const status = box.querySelector(".paged-kv-live-status");
    status.style.display = "";
    status.textContent = `Live mode could not start: ${err.message}`;
  }
}
