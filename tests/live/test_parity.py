"""Parity: each panel's scripted actions give byte-identical figure JSON in Pyodide (Node, Debian's
nodejs) and in CPython."""

import json
import shutil
import subprocess

import pytest

from paged_kv.panels import registry

from live_helpers import ROOT, cpython_hashes, live_assets, pure_wheel  # noqa: F401 (fixtures)

NODE = shutil.which("node") or shutil.which("nodejs")


@pytest.mark.skipif(NODE is None, reason="parity test skipped: Debian's nodejs is not installed (.ci/run installs it)")
def test_every_panel_gives_cpythons_figures_in_pyodide(live_assets, pure_wheel):
    proc = subprocess.run([NODE, str(ROOT / "scripts" / "live_parity.mjs"), str(live_assets), str(pure_wheel)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pyodide = json.loads(proc.stdout.strip().splitlines()[-1])
    here = registry.available()
    assert "calculator" in here and set(pyodide) == set(here), (sorted(pyodide), sorted(here), proc.stderr[-1500:])
    for name in here:
        expected = cpython_hashes(name)
        assert len(expected) == len(here[name].demo_actions) + 1
        assert pyodide[name] == expected, f"{name}: Pyodide's figures differ from CPython's"
        assert len(set(expected)) > 1, f"{name}: its demo actions never change the figure"
