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

Units: rates in requests per second, latencies in seconds per output token.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from ..defaults import BLOCK_SIZE
from ..errors import ConfigError
from ..validate import count, real
from .paper_setup import ServingSetup
from .sharing import GroupContiguousPolicy, SharedPagedPolicy, Sharing
from .simulator import simulate
from .traces import Trace

__all__ = ["capacity", "latency_sweep", "normalized_latency", "sweep_rates"]

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
                  num_requests: int = 400, seed: int = 0, block_size: int = BLOCK_SIZE) -> Curves:
    """Normalized latency against request rate for requests of ``sharing.width`` sequences (the
    shape of the paper's Figure 14), by :func:`sweep_rates`: ``{policy name: (rates, latencies)}``.

    ``"paged"`` is :class:`~paged_kv.sim.SharedPagedPolicy` with ``sharing``; ``"oracle"``,
    ``"pow2"``, ``"max"`` are :class:`~paged_kv.sim.GroupContiguousPolicy` with that Orca rule.
    Each serves on ``setup``'s pool, context length and step time; a policy's curve stops at the
    first trace one of whose requests it could never hold (Orca (Max) x 6 on a small pool).
    """
    step_time = setup.iteration_time()

    def serve(key):
        def run(trace):
            policy = _group_policy(setup, key, sharing, block_size)
            if not all(policy.fits(int(p), int(o)) for p, o in zip(trace.prompt_len, trace.output_len)):
                return None
            return normalized_latency(trace, simulate(trace, policy, iteration_time=step_time).finish_s)
        return run

    measure = {_group_policy(setup, key, sharing, block_size).name: serve(key) for key in policies}
    return sweep_rates(setup, rates, measure, num_requests, seed)


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
