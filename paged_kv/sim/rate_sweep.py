"""Latency against load: the vLLM paper's serving metric, its curves over request rates, and the
rate where a curve crosses a threshold.

The paper's metric (Kwon et al., SOSP 2023, §6.1) is the **normalized latency**: "the mean of
every request's end-to-end latency divided by its output length", in seconds per output token.
Its figures plot it against the request rate (Fig. 12 for basic sampling, Fig. 14 for parallel
sampling and beam search); a system's capacity is the rate at which its curve turns up.

:func:`sweep_rates` is the one loop behind every such curve: each system serves the *same* trace
at each rate (drawn from a :class:`~paged_kv.sim.ServingSetup`), so two curves differ only by the
system.  The engine's :func:`paged_kv.engine.rate_sweep` (chapter 7) and :func:`latency_sweep`
here (sharing groups in the simulator, chapter 6) both run through it.

:func:`sustained_rate` finds the knee without a grid: the rate at which a system finishes
requests when every request of a trace is already waiting (:func:`finish_rate`).  A curve over a
finite trace cannot show a knee past the latency of serving that whole trace at once, so a
threshold read off it (:func:`capacity`) depends on the trace's length; the sustained rate does
not (beyond a few thousand requests), and a long enough trace's curve turns up at it.

Units: rates in requests per second, latencies in seconds per output token.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from ..defaults import BLOCK_SIZE
from ..errors import ConfigError
from ..validate import count, real
from .contiguous import ORCA_POLICIES
from .paper_setup import ServingSetup
from .sharing import GroupContiguousPolicy, SharedPagedPolicy, Sharing
from .simulator import IterationTime, simulate
from .traces import Trace

__all__ = ["capacity", "finish_rate", "latency_sweep", "normalized_latency", "sustained_rate", "sweep_rates"]

Curves = dict[str, tuple[list[float], list[float]]]


def normalized_latency(trace: Trace, finish_s) -> float:
    """The paper's metric (§6.1): the mean over requests of (finish - arrival) / output length, in
    seconds per output token, for requests of ``trace`` that finished at ``finish_s`` ``[N]`` (s)."""
    finish = np.asarray(finish_s, dtype=np.float64)
    if finish.shape != trace.arrival_s.shape:
        raise ConfigError(f"finish_s must hold one time per request ({len(trace)}), got shape {finish.shape}")
    return float(np.mean((finish - trace.arrival_s) / trace.output_len))


def sweep_rates(setup: ServingSetup, rates, measure: Mapping[str, Callable[[Trace], float | None]],
                num_requests: int = 300, seed: int = 0, stop_above: float | None = None) -> Curves:
    """``{name: (rates, values)}``: ``measure[name](trace)`` for the trace of ``setup`` at each rate.

    Every system is handed the same trace at a rate (``setup.trace(seed, num_requests, rate)``).
    A measure returns a number (a normalized latency, a mean batch) or ``None`` when that system
    cannot serve the trace at all (e.g. one request's regions exceed the pool): its curve stops
    there.  ``stop_above``: once a value exceeds it, that system's higher rates are skipped (past
    saturation latency only grows; this saves time).  Rates must be increasing numbers > 0.
    """
    rates = [real("rate (req/s)", r, 0.0, low_open=True) for r in rates]
    if any(b <= a for a, b in zip(rates, rates[1:])):
        raise ConfigError(f"rates must increase, got {rates}")
    num_requests, seed = count("num_requests", num_requests), count("seed", seed, 0)
    out: Curves = {}
    for name, run in measure.items():
        xs, ys = [], []
        for rate in rates:
            value = run(setup.trace(seed=seed, num_requests=num_requests, rate_per_s=rate))
            if value is None:
                break
            xs.append(rate)
            ys.append(float(value))
            if stop_above is not None and value > stop_above:
                break
        out[name] = (xs, ys)
    return out


def latency_sweep(setup: ServingSetup, sharing: Sharing, rates, policies=("paged", "oracle", "pow2"),
                  num_requests: int = 400, seed: int = 0, block_size: int = BLOCK_SIZE,
                  stop_above: float | None = None) -> Curves:
    """Normalized latency against request rate for requests of ``sharing.width`` sequences (the
    shape of the paper's Figure 14), by :func:`sweep_rates`: ``{system: (rates, latencies)}``.

    ``"paged"`` is :class:`~paged_kv.sim.SharedPagedPolicy` with ``sharing``, named ``"paged (vLLM)"``;
    ``"oracle"``, ``"pow2"``, ``"max"`` are :class:`~paged_kv.sim.GroupContiguousPolicy` with that Orca
    rule, named after it (``"Orca (Oracle)"``).  The names do not carry the width, so the curves of
    several widths line up system by system.  Each serves on ``setup``'s pool, context length and
    step time; a policy's curve stops at the first trace one of whose requests it could never hold
    (Orca (Max) x 6 on a small pool), and after its first value above ``stop_above`` (if given).

    Raises:
        ConfigError: an unknown policy, or a bad rate, count or seed (:func:`sweep_rates`).
    """
    step_time = setup.iteration_time()

    def serve(key):
        def run(trace):
            policy = _group_policy(setup, key, sharing, block_size)
            if not all(policy.fits(int(p), int(o)) for p, o in zip(trace.prompt_len, trace.output_len)):
                return None
            return normalized_latency(trace, simulate(trace, policy, iteration_time=step_time).finish_s)
        return run

    measure = {system_name(key): serve(key) for key in policies}      # an unknown key raises here
    return sweep_rates(setup, rates, measure, num_requests, seed, stop_above)


def finish_rate(finish_s, window=(0.2, 0.8)) -> float:
    """Requests finished per second between two quantiles of the finish order: with ``f`` the
    sorted finish times ``[N]`` (s) and ``i = int(q * (N - 1))`` for ``q`` in ``window``,
    ``(i1 - i0) / (f[i1] - f[i0])``.  Leaving out the first and last finishes leaves out the
    start (the pool filling) and the end (the queue draining) of a run that starts with every
    request waiting.

    Raises:
        ConfigError: ``window`` not two numbers ``0 <= q0 < q1 <= 1``, or no time between the two
            finishes (too few requests for the window: the message names them).
    """
    f = np.sort(np.asarray(finish_s, dtype=np.float64))
    try:
        q0, q1 = window
    except (TypeError, ValueError):
        raise ConfigError(f"window must be two quantiles (q0, q1), got {window!r}") from None
    q0, q1 = real("window[0]", q0, 0.0, 1.0), real("window[1]", q1, 0.0, 1.0)
    if q0 >= q1:
        raise ConfigError(f"window must have q0 < q1, got {window!r}")
    i0, i1 = int(q0 * (len(f) - 1)), int(q1 * (len(f) - 1))
    if i1 <= i0 or f[i1] <= f[i0]:
        raise ConfigError(f"{len(f)} finishes leave no time between quantiles {q0} and {q1}: use more requests")
    return float((i1 - i0) / (f[i1] - f[i0]))


def sustained_rate(setup: ServingSetup, sharing: Sharing, policies=("paged", "oracle"), num_requests: int = 2000,
                   seed: int = 0, block_size: int = BLOCK_SIZE, window=(0.2, 0.8),
                   iteration_time: IterationTime | None = None) -> dict[str, float]:
    """The request rate each system sustains, ``{system: req/s}`` (names as :func:`latency_sweep`).

    All ``num_requests`` requests of ``setup``'s trace (the lengths of ``setup.trace(seed,
    num_requests)``) arrive at once, so the system never waits for work; its rate is
    :func:`finish_rate` over ``window``.  Below that rate a stream of requests is served as fast
    as it comes; above it the queue, and with it the latency, grows with the length of the trace
    (a queue's stability condition).  That is the knee of a latency curve, found without a grid
    of rates: on a finite trace the curve levels off once the whole trace queues, so a latency
    threshold read off it (:func:`capacity`) can lie far above this rate, or never be reached.
    A system that could never hold one of the requests gets NaN.  ``iteration_time``: the step
    time (default: ``setup``'s roofline).

    Raises:
        ConfigError: an unknown policy, a bad count, seed or window (:func:`finish_rate`).
    """
    num_requests, seed = count("num_requests", num_requests), count("seed", seed, 0)
    base = setup.trace(seed=seed, num_requests=num_requests)
    burst = Trace(np.zeros(num_requests), base.prompt_len, base.output_len, f"{base.name} (all at once)")
    step_time = setup.iteration_time() if iteration_time is None else iteration_time
    out = {}
    for key in policies:
        policy = _group_policy(setup, key, sharing, block_size)
        if not all(policy.fits(int(p), int(o)) for p, o in zip(burst.prompt_len, burst.output_len)):
            out[system_name(key)] = float("nan")
            continue
        out[system_name(key)] = finish_rate(simulate(burst, policy, iteration_time=step_time).finish_s, window)
    return out


def system_name(key: str) -> str:
    """The name a system's curve and rate carry: ``"paged (vLLM)"`` or an Orca rule's name
    (``"Orca (Oracle)"``), the same at every width."""
    if key == "paged":
        return "paged (vLLM)"
    if key not in ORCA_POLICIES:
        raise ConfigError(f"unknown policy {key!r}; known: paged, oracle, pow2, max")
    return ORCA_POLICIES[key].name


def _group_policy(setup: ServingSetup, key: str, sharing: Sharing, block_size: int):
    """A fresh policy for :func:`latency_sweep`: paged with ``sharing``, or an Orca rule per sequence."""
    if key == "paged":
        return SharedPagedPolicy(setup.pool_slots, setup.max_seq_len, block_size, sharing)
    if key not in ("oracle", "pow2", "max"):
        raise ConfigError(f"unknown policy {key!r}; known: paged, oracle, pow2, max")
    return GroupContiguousPolicy(setup.pool_slots, setup.max_seq_len, key, sharing.width)


def capacity(rates, latencies, threshold: float) -> float:
    """The request rate at which a latency curve first reaches ``threshold`` (linear between the
    two rates around the crossing); the last rate if it never does, the first if it starts above,
    NaN for an empty curve."""
    rates, lat = list(rates), list(latencies)
    if not rates:
        return float("nan")
    if lat[0] >= threshold:
        return float(rates[0])
    for (r0, y0), (r1, y1) in zip(zip(rates, lat), zip(rates[1:], lat[1:])):
        if y1 >= threshold:
            return float(r0 + (r1 - r0) * (threshold - y0) / (y1 - y0))
    return float(rates[-1])
