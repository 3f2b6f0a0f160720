"""Request traces for the memory simulator: arrival times and prompt/output lengths.

A trace is three aligned arrays (arrival in seconds, prompt length and output length in tokens),
the input of :func:`paged_kv.sim.simulate`.  It is plain data: build one from the synthetic
workloads below, from hand-written rows, or from a user's own CSV/JSON file.

Follows the workload of the vLLM paper (Kwon et al., SOSP 2023, §6.1): lengths shaped like the
ShareGPT and Alpaca datasets (Fig. 11), and Poisson arrivals at a given request rate, "since these
datasets do not include timestamps".  Like vLLM's benchmark scripts, pairs with a prompt over
1,024 tokens, a total over the model's 2,048, or a side under 4 tokens are pruned.

The datasets themselves are not bundled.  :class:`LengthModel` stands in for them: independent
log-normal prompt and output lengths, rounded to whole tokens, whose location parameters are
solved (on an exact integer grid, no sampling) so that the means *after pruning* equal the paper's.
The spreads (``sigma_*``) are our choice, picked to look like Fig. 11's long right tails; they are
not fitted to the real datasets, which is why the book calls these traces "ShareGPT-like".
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..validate import count, numeric_array, real

__all__ = ["ALPACA_LIKE", "LENGTH_MODELS", "SHAREGPT_LIKE", "LengthModel", "Trace", "length_model", "load_trace",
           "poisson_arrivals", "synthetic_trace", "trace_from_rows"]

_erf = np.frompyfunc(math.erf, 1, 1)


@dataclass(frozen=True)
class Trace:
    """A stream of requests, sorted by arrival.

    Attributes:
        arrival_s: ``[N]`` float64, seconds since the trace starts, non-decreasing.
        prompt_len: ``[N]`` int64, prompt tokens per request (>= 1).
        output_len: ``[N]`` int64, tokens each request will generate (>= 1); the simulator's
            "oracle" policies may read it, real systems cannot.
        name: a label for tables and figures.

    Raises:
        ConfigError: arrays of different lengths, or a value outside its range above (lengths are
            whole numbers; arrivals finite, >= 0 and sorted).
    """

    arrival_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    name: str = "trace"

    def __post_init__(self) -> None:
        a = numeric_array("arrival_s", self.arrival_s).astype(np.float64)
        p = _lengths("prompt_len", self.prompt_len)
        o = _lengths("output_len", self.output_len)
        if not (len(a) == len(p) == len(o)):
            raise ConfigError(f"trace arrays differ in length: arrival {len(a)}, prompt {len(p)}, output {len(o)}")
        bad = np.flatnonzero(~np.isfinite(a) | (a < 0))
        if len(bad):
            raise ConfigError(f"arrival_s must be finite and >= 0, got {a[bad[0]].item()!r} (request {bad[0]})")
        back = np.flatnonzero(np.diff(a) < 0)
        if len(back):
            i = back[0] + 1
            raise ConfigError(f"arrival_s must be sorted (non-decreasing): request {i} arrives at "
                              f"{a[i].item()!r} s, after request {i - 1} at {a[i - 1].item()!r} s")
        object.__setattr__(self, "arrival_s", a)
        object.__setattr__(self, "prompt_len", p)
        object.__setattr__(self, "output_len", o)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def total_len(self) -> np.ndarray:
        """``[N]`` int64: prompt + output tokens, the longest each request's KV cache gets."""
        return self.prompt_len + self.output_len

    def summary(self) -> dict:
        """Count, duration (s), measured rate (req/s), and mean prompt/output lengths (tokens)."""
        n = len(self)
        span = float(self.arrival_s[-1] - self.arrival_s[0]) if n > 1 else 0.0
        return {"name": self.name, "requests": n, "duration_s": span,
                "rate_per_s": (n - 1) / span if span > 0 else float("nan"),
                "mean_prompt": float(self.prompt_len.mean()) if n else float("nan"),
                "mean_output": float(self.output_len.mean()) if n else float("nan")}

    def to_csv(self, path: str | Path) -> None:
        """Write ``arrival_s,prompt_len,output_len`` rows (readable by :func:`load_trace`)."""
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["arrival_s", "prompt_len", "output_len"])
            for a, p, o in zip(self.arrival_s.tolist(), self.prompt_len.tolist(), self.output_len.tolist()):
                w.writerow([repr(a), p, o])


def _lengths(label: str, values) -> np.ndarray:
    """``[N]`` int64 token counts; each must be finite, whole and in [1, 2**53]."""
    x = numeric_array(label, values)
    xf = x.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(xf) | (np.round(xf) != xf) | (xf < 1) | (xf > 2.0**53))
    if len(bad):
        raise ConfigError(f"{label} must hold whole numbers >= 1, got {x[bad[0]].item()!r} (request {bad[0]})")
    return x.astype(np.int64)


def trace_from_rows(rows, name: str = "hand-made") -> Trace:
    """A :class:`Trace` from ``(arrival_s, prompt_len, output_len)`` rows, sorted stably by arrival.

    Raises:
        ConfigError: a row that is not three numbers, or values :class:`Trace` rejects.
    """
    try:
        rows = [tuple(r) for r in rows]
    except TypeError:
        raise ConfigError(f"rows must be an iterable of (arrival_s, prompt_len, output_len), got {rows!r:.80}") from None
    for i, r in enumerate(rows):
        if len(r) != 3:
            raise ConfigError(f"each row must be (arrival_s, prompt_len, output_len); row {i} is {r!r}")
    if not rows:
        return Trace(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64), name)
    a = numeric_array("arrival_s", [r[0] for r in rows]).astype(np.float64)
    order = np.argsort(a, kind="stable")
    return Trace(a[order], [rows[i][1] for i in order], [rows[i][2] for i in order], name)


_COLUMNS = {"arrival_s": ("arrival_s", "arrival", "arrival_time", "time", "timestamp"),
            "prompt_len": ("prompt_len", "prompt_tokens", "input_len", "input_tokens", "prompt"),
            "output_len": ("output_len", "output_tokens", "completion_tokens", "output")}


def _pick(keys, want: str, path) -> str:
    for k in _COLUMNS[want]:
        if k in keys:
            return k
    raise ConfigError(f"{path}: no column for {want}; expected one of {_COLUMNS[want]}, found {sorted(keys)}")


def load_trace(path: str | Path, name: str | None = None) -> Trace:
    """Load a user's trace from CSV (header row) or JSON (a list of objects, or an object of lists).

    Columns/keys: arrival (seconds; also ``arrival``, ``time``, ``timestamp``), prompt length
    (``prompt_len``, ``input_len``, ``prompt_tokens``...) and output length (``output_len``,
    ``completion_tokens``...).  Rows are sorted by arrival; arrivals are shifted to start at 0.

    Raises:
        ConfigError: unknown extension, a missing column, or values :class:`Trace` rejects.
    """
    path = Path(path)
    if path.suffix.lower() == ".csv":
        with open(path, newline="") as f:
            records = list(csv.DictReader(f))
    elif path.suffix.lower() == ".json":
        data = json.loads(path.read_text())
        records = ([dict(zip(data, vals)) for vals in zip(*data.values())] if isinstance(data, dict)
                   else list(data))
    else:
        raise ConfigError(f"{path}: trace files must end in .csv or .json")
    if not records:
        raise ConfigError(f"{path}: the trace holds no requests")
    keys = set(records[0])
    ka, kp, ko = (_pick(keys, w, path) for w in ("arrival_s", "prompt_len", "output_len"))
    try:  # lengths stay floats here so that Trace rejects "2.5" or "inf" instead of truncating
        rows = [(float(r[ka]), float(r[kp]), float(r[ko])) for r in records]
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: non-numeric value in trace ({e})") from None
    t0 = min(r[0] for r in rows)
    return trace_from_rows([(a - t0, p, o) for a, p, o in rows], name or path.stem)


def poisson_arrivals(num_requests: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    """``[N]`` float64 arrival times (s) of a Poisson process: exponential gaps of mean 1/rate.

    The first request arrives after one gap, not at 0, as in vLLM's benchmark client.
    """
    n = count("num_requests", num_requests, minimum=0)
    rate = real("rate_per_s", rate_per_s, 0.0, low_open=True)
    if not isinstance(rng, np.random.Generator):
        raise ConfigError(f"rng must be a numpy.random.Generator, got {rng!r}")
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


@dataclass(frozen=True)
class LengthModel:
    """Independent log-normal prompt/output lengths, pruned like vLLM's benchmark, with set means.

    Attributes:
        name: label, e.g. ``"ShareGPT-like"``.
        mean_prompt, mean_output: target means (tokens) of the *pruned* distribution.
        sigma_prompt, sigma_output: log-space spreads (our choice; larger = longer tail).
        min_len: shortest prompt or output kept (vLLM's benchmark prunes < 4).
        max_prompt: longest prompt kept (1,024 in vLLM's benchmark).
        max_total: longest prompt + output kept (the model's context, 2,048 for OPT).
        source: where the target means come from.
    """

    name: str
    mean_prompt: float
    mean_output: float
    sigma_prompt: float
    sigma_output: float
    min_len: int = 4
    max_prompt: int = 1024
    max_total: int = 2048
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for label in ("min_len", "max_prompt", "max_total"):
            count(label, getattr(self, label))
        for label in ("mean_prompt", "mean_output", "sigma_prompt", "sigma_output"):
            real(label, getattr(self, label))
        if not (1 <= self.min_len <= self.max_prompt < self.max_total):
            raise ConfigError(f"need 1 <= min_len <= max_prompt < max_total, got "
                              f"{self.min_len}, {self.max_prompt}, {self.max_total}")
        if not (self.min_len < self.mean_prompt < self.max_prompt and
                self.min_len < self.mean_output < self.max_total - self.min_len):
            raise ConfigError(f"means ({self.mean_prompt}, {self.mean_output}) must lie inside the length bounds")
        if not (self.sigma_prompt > 0 and self.sigma_output > 0):
            raise ConfigError("sigma_prompt and sigma_output must be > 0")

    def _pmf(self, mu: float, sigma: float, kmax: int) -> np.ndarray:
        """``[kmax + 1]`` P(round(lognormal) == k) for k = 0..kmax (entries below min_len zeroed)."""
        upper = np.log(np.arange(kmax + 1) + 0.5)  # k is what [k - 0.5, k + 0.5) rounds to
        cdf = 0.5 * (1.0 + _erf((upper - mu) / (sigma * math.sqrt(2.0))).astype(np.float64))
        pmf = np.diff(np.concatenate([[0.0], cdf]))
        pmf[: self.min_len] = 0.0
        return pmf

    def _joint(self, mu_p: float, mu_o: float):
        """Accepted-pair weights: marginal of prompts, and cumulative output mass/moment tables."""
        pp = self._pmf(mu_p, self.sigma_prompt, self.max_prompt)
        po = self._pmf(mu_o, self.sigma_output, self.max_total)
        cdf_o, mom_o = np.cumsum(po), np.cumsum(po * np.arange(len(po)))
        room = self.max_total - np.arange(len(pp))  # longest output each prompt length allows
        w = pp * cdf_o[room]
        return pp, po, w, mom_o[room], cdf_o

    def _means(self, mu_p: float, mu_o: float) -> tuple[float, float]:
        pp, _, w, mom, _ = self._joint(mu_p, mu_o)
        z = w.sum()
        return float((w * np.arange(len(pp))).sum() / z), float((pp * mom).sum() / z)

    @cached_property
    def mus(self) -> tuple[float, float]:
        """Log-space locations ``(mu_prompt, mu_output)`` that give the target pruned means."""
        def solve(f, target):  # bisection on a monotone mean(mu)
            lo, hi = -5.0, 10.0
            for _ in range(50):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
            return 0.5 * (lo + hi)

        mu_p = math.log(self.mean_prompt) - self.sigma_prompt ** 2 / 2
        mu_o = math.log(self.mean_output) - self.sigma_output ** 2 / 2
        for _ in range(3):  # the two means couple only through the max_total cut: 3 rounds suffice
            mu_p = solve(lambda m: self._means(m, mu_o)[0], self.mean_prompt)
            mu_o = solve(lambda m: self._means(mu_p, m)[1], self.mean_output)
        return mu_p, mu_o

    def expected_means(self) -> tuple[float, float]:
        """Exact means (tokens) of the pruned distribution this model samples from."""
        return self._means(*self.mus)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` pruned (prompt_len, output_len) pairs, int64 each, drawn exactly (no rejection loop).

        A prompt length is drawn from its marginal over accepted pairs, then an output length
        from the output distribution cut to ``[min_len, max_total - prompt]``, by inverse CDF.
        """
        pp, _, w, _, cdf_o = self._joint(*self.mus)
        cdf_p = np.cumsum(w) / w.sum()
        p = np.minimum(np.searchsorted(cdf_p, rng.random(n), side="right"), len(pp) - 1)
        lo = cdf_o[self.min_len - 1]
        hi = cdf_o[self.max_total - p]
        o = np.searchsorted(cdf_o, lo + rng.random(n) * (hi - lo), side="right")
        o = np.clip(o, self.min_len, self.max_total - p)
        return p.astype(np.int64), o.astype(np.int64)


_PAPER_FIG11 = "vLLM paper (Kwon et al., SOSP 2023), Fig. 11 means; §6.1: ShareGPT has 8.4x longer inputs, 5.8x longer outputs"
SHAREGPT_LIKE = LengthModel("ShareGPT-like", 161.31, 337.99, sigma_prompt=1.3, sigma_output=1.0, source=_PAPER_FIG11)
ALPACA_LIKE = LengthModel("Alpaca-like", 19.31, 58.45, sigma_prompt=0.6, sigma_output=0.8, source=_PAPER_FIG11)
LENGTH_MODELS = {"sharegpt": SHAREGPT_LIKE, "alpaca": ALPACA_LIKE}


def length_model(lengths: str | LengthModel) -> LengthModel:
    """The :class:`LengthModel` named ``lengths`` (``"sharegpt"``, ``"alpaca"``), or ``lengths`` itself.

    Raises:
        ConfigError: an unknown name (the message lists the known ones) or another type.
    """
    if isinstance(lengths, LengthModel):
        return lengths
    if not isinstance(lengths, str) or lengths.lower() not in LENGTH_MODELS:
        raise ConfigError(f"unknown length model {lengths!r}; known: {sorted(LENGTH_MODELS)} or a LengthModel")
    return LENGTH_MODELS[lengths.lower()]


def synthetic_trace(num_requests: int, rate_per_s: float, lengths: str | LengthModel = "sharegpt",
                    seed: int = 0) -> Trace:
    """``num_requests`` requests with Poisson arrivals at ``rate_per_s`` and lengths from ``lengths``.

    Args:
        lengths: ``"sharegpt"``, ``"alpaca"`` or a :class:`LengthModel`.
        seed: the same seed gives the same trace (one ``numpy.random.Generator`` for everything).

    Raises:
        ConfigError: an unknown ``lengths`` name, or a bad count, rate or seed (the message names it).
    """
    lengths = length_model(lengths)
    num_requests = count("num_requests", num_requests)
    rate_per_s = real("rate_per_s", rate_per_s, 0.0, low_open=True)
    rng = np.random.default_rng(count("seed", seed, minimum=0))
    arrivals = poisson_arrivals(num_requests, rate_per_s, rng)
    prompt, output = lengths.sample(num_requests, rng)
    return Trace(arrivals, prompt, output, f"{lengths.name} @ {rate_per_s:g} req/s")
