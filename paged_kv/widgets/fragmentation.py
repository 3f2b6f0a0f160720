"""The live memory-strip panel (chapter 4): pick a policy, a request rate and a block size, and
watch the KV pool of the paper's set-up fill, fragment and empty.

Every change re-runs :func:`paged_kv.sim.simulate` on a short trace (a few hundred
requests: well under a second) and redraws :func:`paged_kv.viz.fragmentation.strip_figure` in
place in a ``go.FigureWidget``, or into an ``ipywidgets.Output`` where FigureWidget is
unavailable (it needs ``anywidget``).  The time slider only switches between recorded layouts.
A change that fails shows its error in the stats line (:func:`~paged_kv.widgets.panel.guarded`).
"""

from __future__ import annotations

import ipywidgets as w
import numpy as np

from ..defaults import BLOCK_SIZE
from ..sim import PAPER_SETUP, PLACEMENTS, ServingSetup, SimResult
from ..viz.fragmentation import refresh_strip, strip_figure
from .panel import figure_widget_or_output, guarded, status_html, update_figure

POLICY_NAMES = {"Orca (Max)": "max", "Orca (Pow2)": "pow2", "Orca (Oracle)": "oracle", "paged": "paged"}
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def run_strip(setup: ServingSetup, policy: str, rate_per_s: float, block_size: int = BLOCK_SIZE,
              placement: str = "buddy", num_requests: int = 300, frames: int = 40,
              horizon_s: float = 120.0, seed: int = 0) -> SimResult:
    """Simulate ``num_requests`` of ``setup`` at ``rate_per_s`` and record ``frames`` layouts
    evenly over the first ``horizon_s`` seconds (or until the last arrival, if sooner)."""
    trace = setup.trace(seed=seed, num_requests=num_requests, rate_per_s=rate_per_s)
    end = min(horizon_s, float(trace.arrival_s[-1]))
    kw = {"block_size": block_size} if policy == "paged" else {"placement": placement}
    return setup.run(policy, trace=trace, layout_times=np.linspace(0.0, end, frames), **kw)


def strip_panel(setup: ServingSetup = PAPER_SETUP, num_requests: int = 300, frames: int = 40,
                horizon_s: float = 120.0, use_figure_widget: bool | None = None):
    """Controls (rate, policy, placement, block size, time) over a live strip; returns an
    ``ipywidgets.VBox``; its ``.state["res"]`` is the latest :class:`SimResult`.

    ``use_figure_widget``: ``None`` tries ``go.FigureWidget`` and falls back to redrawing into
    an ``Output``; ``False`` always redraws; ``True`` raises if FigureWidget is unavailable."""
    rate = w.FloatSlider(value=setup.rate_per_s, min=0.25, max=6.0, step=0.25, description="req/s",
                         continuous_update=False)
    policy = w.Dropdown(options=list(POLICY_NAMES), value="Orca (Oracle)", description="policy")
    placement = w.Dropdown(options=list(PLACEMENTS), value="buddy", description="placement")
    block = w.Dropdown(options=BLOCK_SIZES, value=BLOCK_SIZE, description="block size", disabled=True)
    when = w.IntSlider(value=frames - 1, min=0, max=frames - 1, description="frame", continuous_update=True)
    stats = w.HTML()
    state: dict = {}

    def simulate_now() -> None:
        key = POLICY_NAMES[policy.value]
        block.disabled, placement.disabled = key != "paged", key == "paged"
        res = run_strip(setup, key, rate.value, block.value, placement.value, num_requests, frames, horizon_s)
        state["res"] = res
        state["runs"] = {res.policy: res.layouts}
        when.max = len(res.layouts) - 1
        s, used = res.summary(), res.used_shares()
        state["summary"] = (f"<b>{res.policy}</b> at {rate.value:g} req/s, {num_requests} requests: "
                            f"mean batch <b>{s['mean_batch']:.2f}</b> · token states "
                            f"{100 * used['token_states']:.1f}% "
                            f"of the memory in use · reserved {100 * used['reserved']:.1f}% · internal "
                            f"{100 * used['internal']:.1f}% · external {100 * used['external']:.1f}% · "
                            f"free {100 * s['free_share']:.1f}% of the pool · preemptions {s['preemptions']}")
        stats.value = state["summary"]            # shown again after a frame that failed

    simulate_now()
    title = f"{setup.model}: {setup.pool_slots:,} KV slots"
    fig = strip_figure(state["runs"], title=title, active=when.value, replay=False)
    fig, out = figure_widget_or_output(fig, use_figure_widget)

    def redraw() -> None:
        i = min(when.value, len(state["res"].layouts) - 1)
        update_figure(fig, out, lambda f: refresh_strip(f, state["runs"], i, title),
                      lambda: strip_figure(state["runs"], title=title, active=i, replay=False))

    def on_setting(_):
        simulate_now()
        redraw()

    def show_error(note: str) -> None:           # the stats line of the failed run, not the last one
        stats.value = status_html(note, "the figure still shows the last run that worked")

    def on_frame(_):
        redraw()
        stats.value = state["summary"]           # in place of an error a failed frame showed

    for control in (rate, policy, placement, block):
        control.observe(guarded(on_setting, show_error), names="value")
    when.observe(guarded(on_frame, show_error), names="value")
    redraw()
    panel = w.VBox([w.HBox([policy, placement, block]), w.HBox([rate, when]), stats, fig if out is None else out])
    panel.state = state
    return panel


__all__ = ["BLOCK_SIZES", "POLICY_NAMES", "run_strip", "strip_panel"]
