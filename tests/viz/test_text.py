"""The prose helpers of viz/text.py: a number's power of ten and its scientific notation, checked
against exact rational arithmetic, not against a second float formula."""

import math
import random
import re
from fractions import Fraction

import numpy as np
import pytest

from paged_kv.errors import ConfigError
from paged_kv.viz.text import md_table, order_of_magnitude, sci_tex


def _floats(n=1000, seed=0, step=1):
    rng = random.Random(seed)
    xs = [rng.choice((-1, 1)) * 10 ** rng.uniform(-300, 300) for _ in range(n)]
    xs += [10.0 ** k for k in range(-300, 301, step)]               # powers of ten, as floats
    xs += [math.nextafter(10.0 ** k, 0) for k in range(-300, 301, step)]   # just below each
    xs += [4.3e-48, 1.5e-9, 999.9999, 0.001, 5e-324, 1.7976931348623157e308]
    return xs


def test_order_of_magnitude_brackets_the_number_exactly():
    for x in _floats():
        e = order_of_magnitude(x)
        v = abs(Fraction(repr(x)))                                    # the decimal that x stands for
        assert Fraction(10) ** e <= v < Fraction(10) ** (e + 1), (x, e)


def test_the_chapter_8_case_that_rounding_a_log_got_wrong():
    x = 4.3e-48
    assert round(math.log10(x)) == -47                                # what the chapter printed
    assert order_of_magnitude(x) == -48
    assert sci_tex(x) == r"4.3 \times 10^{-48}"


def test_integers_and_numpy_scalars():
    for n in [1, 9, 10, 99, 100, 12345, -7, 10 ** 400, 10 ** 400 - 1]:
        assert order_of_magnitude(n) == len(str(abs(n))) - 1
    assert order_of_magnitude(np.int64(1000)) == 3
    assert order_of_magnitude(np.float32(0.25)) == -1


def test_sci_tex_round_trips_to_the_stated_digits():
    pattern = re.compile(r"^(-?\d(?:\.\d+)?) \\times 10\^\{(-?\d+)\}$")
    for digits in (1, 2, 3):
        for x in _floats(150, seed=digits, step=7):
            m, e = pattern.match(sci_tex(x, digits)).groups()
            mantissa = Fraction(m)
            assert 1 <= abs(mantissa) < 10 and len(m.lstrip("-").replace(".", "")) == digits
            value, exact = mantissa * Fraction(10) ** int(e), Fraction(repr(x))
            # within half a unit of the last digit shown
            assert abs(value - exact) <= Fraction(1, 2) * Fraction(10) ** (int(e) - digits + 1), (x, digits)
    assert sci_tex(9.96e-48) == r"1.0 \times 10^{-47}"               # the mantissa rounds up a power


@pytest.mark.parametrize("bad", [0, 0.0, math.inf, -math.inf, math.nan, True, "1e5", None])
def test_no_power_of_ten_raises(bad):
    with pytest.raises(ConfigError):
        order_of_magnitude(bad)
    with pytest.raises(ConfigError):
        sci_tex(bad)


@pytest.mark.parametrize("digits", [0, -1, 1.5, True])
def test_sci_tex_refuses_bad_digits(digits):
    with pytest.raises(ConfigError):
        sci_tex(1.0, digits)


def test_md_table_refuses_a_short_row():
    assert md_table(["a", "b"], [[1, "x|y"]]).splitlines()[-1] == "| 1 | x\\|y |"
    with pytest.raises(ConfigError):
        md_table(["a", "b"], [[1]])


def test_a_solution_is_markdown_folded_in_a_closed_box():
    from paged_kv.viz.text import solution_markdown
    md = solution_markdown("  B hit **36** tokens, $2^{5}$ blocks.\n")
    lines = md.splitlines()
    assert lines[0].startswith("<details") and " open" not in lines[0] and lines[-1] == "</details>"
    assert "<summary>" in lines[1] and "Solution" in lines[1]
    # blank lines around the text, so that MyST and Jupyter parse it as Markdown, not as raw HTML
    assert lines[2] == "" and lines[3] == "B hit **36** tokens, $2^{5}$ blocks." and lines[4] == ""
    for bad in ("", "   ", "text </details> more", None):
        with pytest.raises(ConfigError):
            solution_markdown(bad)
