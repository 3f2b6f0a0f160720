"""The panel models by name: what a page's ``data-panel="..."`` names, and the browser worker builds.

The table names each class by ``"module:Class"`` and imports it on first use
(:func:`panel_class`), so a panel whose module is missing (or does not import, e.g. in Pyodide)
fails alone, with its name in the error, and the others still load.
"""

from __future__ import annotations

import importlib
import json
from typing import Any, Mapping

from ..errors import ConfigError
from .base import PanelModel

__all__ = ["PANELS", "available", "create", "panel_class"]

#: registry name -> ``"module:Class"`` (the page, the parity test and the browser test use these)
PANELS = {
    "calculator": "paged_kv.panels.calculator:CalculatorPanel",      # chapter 3
    "block_pool": "paged_kv.panels.block_pool:BlockPoolPanel",       # chapter 5
    "fork": "paged_kv.panels.block_pool:ForkPanel",                  # chapter 6
    "serving": "paged_kv.panels.serving:ServingPanel",               # chapter 7
    "prefix_cache": "paged_kv.panels.prefix_cache:PrefixCachePanel",  # chapter 8
    "spec_decode": "paged_kv.panels.spec_decode:SpecDecodePanel",     # chapter 9
}


def panel_class(name: str) -> type[PanelModel]:
    """The panel model class registered as ``name``.

    Raises:
        ConfigError: ``name`` is not registered (the message lists the names).
        ImportError: its module does not import here (the message names the panel).
    """
    if name not in PANELS:
        raise ConfigError(f"no panel named {name!r}; the panels are {sorted(PANELS)}")
    module, _, cls = PANELS[name].partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"panel {name!r} ({PANELS[name]}) does not import: {type(e).__name__}: {e}") from e


def available() -> dict[str, type[PanelModel]]:
    """The registered panels whose modules import here, by name (the others are left out)."""
    out = {}
    for name in PANELS:
        try:
            out[name] = panel_class(name)
        except ImportError:
            continue
    return out


def create(name: str, args: Mapping[str, Any] | str | None = None) -> PanelModel:
    """``panel_class(name)(**args)``; ``args`` a mapping or its JSON text (a page's ``data-args``).

    Raises:
        ConfigError: unknown name, or ``args`` not a JSON object.
        ImportError: the panel's module does not import.
    """
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as e:
            raise ConfigError(f"panel {name!r}: its arguments are not JSON: {args!r:.80} ({e})") from e
    args = {} if args is None else args
    if not isinstance(args, Mapping):
        raise ConfigError(f"panel {name!r}: its arguments must be a JSON object, got {args!r:.80}")
    return panel_class(name)(**args)
