"""Argument checks shared by the package (memory ledger, block bookkeeping, simulator).

Counts accept Python ints and numpy integers (``operator.index``) and reject bools, floats and
strings; real numbers accept ints and floats (numpy's too) and reject bools, strings, NaN and
infinities.  Every failure raises :class:`~paged_kv.errors.ConfigError` naming the argument and
the bad value, never a bare ``TypeError``/``ValueError`` or a silent substitution.

numpy is not imported here: the pure layers that use these checks (``blocks``, ``scheduling``,
``memory``) run where numpy is absent (a pure wheel, the browser).  A numpy value can only exist
once numpy is in ``sys.modules``, so the checks look there; :func:`numeric_array` imports numpy,
since it returns an array.
"""

from __future__ import annotations

import math
import numbers
import operator
import sys
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    import numpy as np


def is_bool(value) -> bool:
    """``value`` is a Python or numpy bool (``numpy.bool_`` is not a ``bool`` subclass).

    numpy is looked up, never imported: if nothing has imported it, no value is a numpy bool.
    """
    if isinstance(value, bool):
        return True
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.bool_)


def count(name: str, value, minimum: int = 1, error: type = ConfigError) -> int:
    """``value`` as a Python int ``>= minimum``.

    Python and numpy integers pass (``operator.index``); bools, floats (even ``2.0``) and other
    types do not: a count of tokens, blocks or bytes is a whole number, and a silent ``int()``
    would turn ``2.7`` tokens into 2.

    Raises:
        ``error`` (default ConfigError): a bool, a float, a non-number, or an int below ``minimum``.
    """
    if type(value) is int and value >= minimum:    # the common case, checked in hot loops
        return value
    if is_bool(value):
        raise error(f"{name} must be an int >= {minimum}, got {value!r} (a bool)")
    try:
        v = operator.index(value)
    except TypeError:
        raise error(f"{name} must be an int >= {minimum}, got {value!r} ({type(value).__name__})") from None
    if v < minimum:
        raise error(f"{name} must be an int >= {minimum}, got {v}")
    return int(v)


def real(name: str, value, low: float = -math.inf, high: float = math.inf, *, low_open: bool = False,
         high_open: bool = False) -> float:
    """``value`` as a finite float in the interval from ``low`` to ``high`` (closed unless ``*_open``).

    Raises:
        ConfigError: a bool, a non-number, NaN, an infinity, a value outside the interval, or an
            int too large for a float.
    """
    if math.isinf(high):
        where = "a finite number" + ("" if math.isinf(low) else f" {'>' if low_open else '>='} {low:g}")
    else:
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        where = f"a finite number in {lo}{low:g}, {high:g}{hi}"
    if is_bool(value) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be {where}, got {value!r}")
    try:
        v = float(value)
    except OverflowError:                     # an int past float's range (10**400)
        raise ConfigError(f"{name} must be {where}, got an int of {len(str(abs(value)))} digits") from None
    if not (math.isfinite(v) and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)):
        raise ConfigError(f"{name} must be {where}, got {value!r}")
    return v


def numeric_array(name: str, values) -> np.ndarray:
    """``values`` as a 1-D numpy array of ints or floats (not bools, strings or objects).

    Raises:
        ConfigError: the values are not all plain numbers.
    """
    import numpy as np                         # only the simulator's inputs are arrays
    try:
        x = np.asarray(values).reshape(-1)
    except (TypeError, ValueError) as e:  # ragged input
        raise ConfigError(f"{name} must be a flat sequence of numbers ({e})") from None
    if x.dtype == bool or not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise ConfigError(f"{name} must hold ints or floats, got {values!r:.80} (dtype {x.dtype})")
    return x


def read_record(path, required: tuple[str, ...], rerun: str) -> dict | None:
    """A JSON record a script wrote at ``path`` (a ``pathlib.Path``), or ``None`` if there is none;
    ``required``: the fields it must have; ``rerun``: the script that writes it, named in errors.

    Raises:
        ConfigError: the file exists but is not such a record (bad JSON or a missing field).
    """
    import json                                # only the readers of recorded runs need it
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e}); rerun {rerun}") from e
    missing = [k for k in required if not isinstance(record, dict) or k not in record]
    if missing:
        raise ConfigError(f"{path} lacks the field(s) {missing}; rerun {rerun}")
    return record
