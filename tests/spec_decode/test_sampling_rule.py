"""The pure rule: its errors name the value, the chooser, the replaying enumerator."""

import random
from fractions import Fraction as F

import pytest

from paged_kv.errors import ConfigError
from paged_kv.spec_decode import check_distribution, rule_outcomes, speculative_sample, uniform_chooser


def test_one_draft_token_by_hand():
    # p = (1/2, 1/2), q = (3/4, 1/4), x = 0: accept with 2/3; on rejection norm(p - q)+ = (0, 1)
    p, q = [F(1, 2), F(1, 2)], [F(3, 4), F(1, 4)]
    out = rule_outcomes(lambda choose: speculative_sample([0], [q], [p, [F(1), F(0)]], choose))
    assert out == {(0, 0): F(2, 3), (1,): F(1, 3)}


def test_uniforms_injected_in_order():
    p, q = [F(1, 2), F(1, 2)], [F(3, 4), F(1, 4)]
    assert speculative_sample([0], [q], [p, p], uniform_chooser(iter([0.5, 0.9]).__next__)) == [0, 1]
    assert speculative_sample([0], [q], [p, p], uniform_chooser(iter([0.7, 0.1]).__next__)) == [1]
    assert speculative_sample([], [], [p], uniform_chooser(random.Random(0).random)) in ([0], [1])


def test_a_weight_zero_index_is_never_chosen():
    choose = uniform_chooser(iter([0.0, 0.999999, 0.5]).__next__)
    assert [choose([0, 1, 0]), choose([1, 0, 0]), choose([0.5, 0, 0.5])] == [1, 0, 2]


@pytest.mark.parametrize("dist, match", [
    ([F(1, 2), F(1, 3)], "sums to 5/6, not 1"),
    ([0.5, 0.49], r"sums to 0.99, not 1 \(within 1e-06\)"),
    ([F(3, 2), F(-1, 2)], r"\[1\] = Fraction\(-1, 2\) is not a probability"),
    ([float("nan"), 1.0], "is not a probability"),
    ([True, 0], "is not a probability"),
    ([], "is empty"),
])
def test_a_distribution_that_is_not_one_is_refused(dist, match):
    with pytest.raises(ConfigError, match=match):
        check_distribution("p", dist)


def test_float_rows_within_the_tolerance_pass():
    assert check_distribution("p", [0.5, 0.5 + 1e-7]) == [0.5, 0.5 + 1e-7]


def test_the_rule_checks_its_arguments():
    p, q = [F(1, 2), F(1, 2)], [F(1), F(0)]
    choose = uniform_chooser(random.Random(0).random)
    with pytest.raises(ConfigError, match="1 draft tokens need 1 draft and 2 target distributions, got 1 and 1"):
        speculative_sample([0], [q], [p], choose)
    with pytest.raises(ConfigError, match=r"draft_tokens\[0\] = 1 has draft probability 0"):
        speculative_sample([1], [q], [p, p], choose)
    with pytest.raises(ConfigError, match=r"draft_tokens\[0\] = 2 is not a token id in \[0, 2\)"):
        speculative_sample([2], [q], [p, p], choose)
    with pytest.raises(ConfigError, match=r"draft_probs\[0\] has 3 entries, expected 2"):
        speculative_sample([0], [[F(1), 0, 0]], [p, p], choose)
    with pytest.raises(ConfigError, match=r"target_probs\[1\] sums to 3/2"):
        speculative_sample([0], [q], [p, [F(1), F(1, 2)]], choose)


def test_seeded_runs_repeat():
    p, q = [F(1, 4), F(3, 4)], [F(1, 2), F(1, 2)]
    runs = [[speculative_sample([1], [q], [p, p], uniform_chooser(random.Random(s).random)) for s in range(20)]
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_the_pure_modules_run_with_torch_and_numpy_blocked():
    """The rule and the enumeration are what the browser build can run: neither torch nor numpy."""
    import subprocess
    import sys

    from conftest import ROOT
    code = ("import sys\n"
            "class B:\n"
            "    def find_spec(self, n, p=None, t=None):\n"
            "        if n.split('.')[0] in ('torch', 'numpy'): raise ImportError(n)\n"
            "sys.meta_path.insert(0, B())\n"
            "from fractions import Fraction as F\n"
            "from paged_kv.spec_decode.enumeration import exact_output_distribution\n"
            "a, b = exact_output_distribution(lambda c: [F(1, 3), F(2, 3)], lambda c: [F(1, 2), F(1, 2)], (), 2, 3)\n"
            "print(a == b, len(a))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["True", "8"], proc.stderr[-2000:]
