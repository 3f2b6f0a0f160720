"""Request traces: the synthetic ShareGPT/Alpaca-like workloads and loading a user's own trace."""

import json

import numpy as np
import pytest

import paged_kv  # noqa: F401  (runtime set-up first)
from paged_kv.errors import ConfigError
from paged_kv.sim import (ALPACA_LIKE, SHAREGPT_LIKE, LengthModel, Trace, load_trace, poisson_arrivals,
                             synthetic_trace, trace_from_rows)

# vLLM paper, Fig. 11: mean input / output lengths (tokens) of the two datasets.  §6.1 says
# ShareGPT has 8.4x longer inputs and 5.8x longer outputs than Alpaca: check that first.
PAPER_MEANS = {"sharegpt": (161.31, 337.99), "alpaca": (19.31, 58.45)}


def test_paper_means_agree_with_the_papers_ratios():
    (sp, so), (ap, ao) = PAPER_MEANS["sharegpt"], PAPER_MEANS["alpaca"]
    assert round(sp / ap, 1) == 8.4 and round(so / ao, 1) == 5.8


@pytest.mark.parametrize("name, model", [("sharegpt", SHAREGPT_LIKE), ("alpaca", ALPACA_LIKE)])
def test_solved_distribution_has_the_papers_means(name, model):
    mp, mo = model.expected_means()
    assert mp == pytest.approx(PAPER_MEANS[name][0], abs=1e-3)
    assert mo == pytest.approx(PAPER_MEANS[name][1], abs=1e-3)


@pytest.mark.parametrize("name", ["sharegpt", "alpaca"])
def test_sampled_means_and_pruning(name):
    tr = synthetic_trace(40_000, 2.0, name, seed=3)
    mp, mo = PAPER_MEANS[name]
    assert tr.prompt_len.mean() == pytest.approx(mp, rel=0.02)
    assert tr.output_len.mean() == pytest.approx(mo, rel=0.02)
    # vLLM benchmark pruning: both sides >= 4, prompt <= 1024, total <= 2048
    assert tr.prompt_len.min() >= 4 and tr.output_len.min() >= 4
    assert tr.prompt_len.max() <= 1024 and tr.total_len.max() <= 2048


def test_sharegpt_is_longer_and_wider_than_alpaca():
    s, a = synthetic_trace(20_000, 1.0, "sharegpt", seed=1), synthetic_trace(20_000, 1.0, "alpaca", seed=1)
    assert s.output_len.std() > 3 * a.output_len.std()


def test_sampler_matches_its_own_pmf():
    """The inverse-CDF sampler draws from the pruned joint: compare one cell's frequency."""
    m = LengthModel("small", 12.0, 20.0, 0.5, 0.5, min_len=4, max_prompt=40, max_total=60)
    p, o = m.sample(200_000, np.random.default_rng(0))
    assert p.max() <= 40 and (p + o).max() <= 60 and min(p.min(), o.min()) >= 4
    # brute-force the pruned probability that the prompt is exactly 10 tokens
    from math import erf, log, sqrt
    mu_p, mu_o = m.mus
    cdf = lambda x, mu: 0.5 * (1 + erf((log(x) - mu) / (0.5 * sqrt(2))))
    pmf = lambda k, mu: cdf(k + 0.5, mu) - cdf(k - 0.5, mu)
    joint = {(a, b): pmf(a, mu_p) * pmf(b, mu_o) for a in range(4, 41) for b in range(4, 61 - a)}
    z = sum(joint.values())
    want = sum(v for (a, _), v in joint.items() if a == 10) / z
    assert (p == 10).mean() == pytest.approx(want, abs=0.004)


def test_poisson_arrivals():
    rng = np.random.default_rng(0)
    a = poisson_arrivals(50_000, 4.0, rng)
    gaps = np.diff(np.concatenate([[0.0], a]))
    assert np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.25, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)  # exponential: CV = 1


def test_same_seed_same_trace_other_seed_other_trace():
    a, b, c = (synthetic_trace(500, 2.0, seed=s) for s in (7, 7, 8))
    for x in ("arrival_s", "prompt_len", "output_len"):
        assert np.array_equal(getattr(a, x), getattr(b, x))
        assert not np.array_equal(getattr(a, x), getattr(c, x))


def test_csv_round_trip(tmp_path):
    tr = synthetic_trace(50, 1.5, seed=2)
    path = tmp_path / "t.csv"
    tr.to_csv(path)
    back = load_trace(path)
    assert np.allclose(back.arrival_s, tr.arrival_s - tr.arrival_s[0])
    assert np.array_equal(back.prompt_len, tr.prompt_len) and np.array_equal(back.output_len, tr.output_len)
    assert back.name == "t"


def test_json_list_and_columns_and_sorting(tmp_path):
    rows = [{"arrival": 3.0, "input_len": 5, "completion_tokens": 7},
            {"arrival": 1.0, "input_len": 2, "completion_tokens": 9}]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "b.json").write_text(json.dumps({"timestamp": [3.0, 1.0], "prompt_tokens": [5, 2],
                                                 "output_len": [7, 9]}))
    for name in ("a.json", "b.json"):
        tr = load_trace(tmp_path / name)
        assert tr.arrival_s.tolist() == [0.0, 2.0]  # sorted, shifted to start at 0
        assert tr.prompt_len.tolist() == [2, 5] and tr.output_len.tolist() == [9, 7]


def test_trace_from_rows_sorts():
    tr = trace_from_rows([(2, 1, 1), (0, 3, 4)])
    assert tr.prompt_len.tolist() == [3, 1] and len(tr) == 2
    assert tr.summary()["mean_output"] == 2.5


def test_bad_input(tmp_path):
    with pytest.raises(ConfigError, match="unknown length model"):
        synthetic_trace(10, 1.0, "imdb")
    with pytest.raises(ConfigError, match="rate_per_s"):
        synthetic_trace(10, 0.0)
    with pytest.raises(ConfigError, match="num_requests"):
        synthetic_trace(0, 1.0)
    with pytest.raises(ConfigError, match="differ in length"):
        Trace(np.zeros(2), np.ones(3), np.ones(2))
    with pytest.raises(ConfigError, match="output_len"):
        Trace(np.zeros(2), np.ones(2), np.array([1, 0]))
    with pytest.raises(ConfigError, match="sorted"):
        Trace(np.array([1.0, 0.0]), np.ones(2), np.ones(2))
    with pytest.raises(ConfigError, match="csv or .json"):
        load_trace(tmp_path / "x.txt")
    (tmp_path / "c.csv").write_text("arrival_s,prompt_len\n0,1\n")
    with pytest.raises(ConfigError, match="output_len"):
        load_trace(tmp_path / "c.csv")
    with pytest.raises(ConfigError, match="means"):
        LengthModel("bad", 2000.0, 10.0, 1.0, 1.0)


def test_lengths_must_be_finite_whole_positive_numbers():
    inf, nan = float("inf"), float("nan")
    for rows, what in ([(0, inf, 3)], "prompt_len"), ([(0, 3, nan)], "output_len"), ([(0, 2.5, 3)], "prompt_len"), \
            ([(0, 1e300, 3)], "prompt_len"), ([(0, True, 3)], "prompt_len"), ([(0, "3", 3)], "prompt_len"), \
            ([(inf, 1, 1)], "arrival_s"), ([(nan, 1, 1)], "arrival_s"), ([(-1, 1, 1)], "arrival_s"), \
            ([("a", 1, 1)], "arrival_s"):
        with pytest.raises(ConfigError, match=what):
            trace_from_rows(rows)
    with pytest.raises(ConfigError, match="row 1"):
        trace_from_rows([(0, 1, 1), (0, 1)])
    with pytest.raises(ConfigError, match="iterable"):
        trace_from_rows(5)
    with pytest.raises(ConfigError, match="prompt_len"):
        Trace(np.zeros(1), np.array([np.inf]), np.ones(1))
    tr = trace_from_rows([(2, np.int32(1), 1.0), (0, 3, np.int64(4))])  # numpy ints, whole floats
    assert tr.prompt_len.tolist() == [3, 1] and tr.output_len.tolist() == [4, 1]


def test_load_trace_rejects_fractional_and_infinite_lengths(tmp_path):
    for bad in ("2.5", "inf", "nan"):
        (tmp_path / "t.csv").write_text(f"arrival_s,prompt_len,output_len\n0,{bad},3\n")
        with pytest.raises(ConfigError, match="prompt_len"):
            load_trace(tmp_path / "t.csv")


def test_counts_accept_numpy_ints_and_reject_bools_and_floats():
    assert len(synthetic_trace(np.int64(5), 1.0)) == 5
    assert len(synthetic_trace(5, np.float32(2.0), seed=np.int64(3))) == 5
    for args, what in (((True, 1.0), "num_requests"), ((5.0, 1.0), "num_requests"), (("5", 1.0), "num_requests"),
                       ((5, "x"), "rate_per_s"), ((5, float("inf")), "rate_per_s"), ((5, float("nan")), "rate_per_s"),
                       ((5, 1.0, 3), "length model"), ((5, 1.0, "sharegpt", -1), "seed")):
        with pytest.raises(ConfigError, match=what):
            synthetic_trace(*args)
    with pytest.raises(ConfigError, match="num_requests"):
        poisson_arrivals(True, 1.0, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="mean_prompt"):
        LengthModel("bad", "161", 10.0, 1.0, 1.0)
