"""How fast the memory simulator runs: 10,000 ShareGPT-like requests through each policy.

Usage: ``python benchmarks/simulate_bench.py [--requests 10000] [--rate 2.0] [--repeat 3]``

The set-up is :data:`paged_kv.sim.PAPER_SETUP` (OPT-13B, 12 GiB of KV = 15,728 slots,
max length 2048, ShareGPT-like lengths at 2 req/s).  Prints, per policy, the best of ``repeat``
wall-clock times, simulated requests per second of wall time, steps per second, and the mean
batch the run produced (a sanity check that every policy did the full work).
"""

from __future__ import annotations

import argparse
import platform
import time

from paged_kv.sim import PAPER_SETUP, simulate


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=PAPER_SETUP.rate_per_s)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    trace = PAPER_SETUP.trace(seed=0, num_requests=args.requests, rate_per_s=args.rate)
    t_trace = time.perf_counter() - t0
    it = PAPER_SETUP.iteration_time()
    print(f"simulate_bench: {args.requests:,} requests, {trace.name}, pool {PAPER_SETUP.pool_slots:,} slots, "
          f"python {platform.python_version()}, best of {args.repeat}")
    print(f"trace generation: {t_trace:.2f} s")
    print(f"{'policy':<14} {'time (s)':>9} {'requests/s':>11} {'steps':>9} {'steps/s':>10} {'mean batch':>11}")
    for name in ("max", "pow2", "oracle", "paged"):
        best, res = float("inf"), None
        for _ in range(args.repeat):
            policy = PAPER_SETUP.policy(name)
            t = time.perf_counter()
            res = simulate(trace, policy, iteration_time=it)
            best = min(best, time.perf_counter() - t)
        print(f"{res.policy:<14} {best:>9.2f} {args.requests / best:>11,.0f} {res.num_steps:>9,} "
              f"{res.num_steps / best:>10,.0f} {res.mean_batch():>11.2f}")


if __name__ == "__main__":
    main()
