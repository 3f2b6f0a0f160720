"""The build side of live mode, without a browser: the pins, the switch, the served plotly, the
precompiled bytecode."""

import importlib.util
import json
import os
import shutil
import zipfile

import pytest

from live_helpers import ROOT, live_assets, pure_wheel, script  # noqa: F401 (fixtures)

NODE = shutil.which("node") or shutil.which("nodejs")


def _live_mode():
    spec = importlib.util.spec_from_file_location("live_mode", ROOT / "book" / "_ext" / "live_mode.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_lock_pins_every_file_by_hash_and_plotlys_own_dependencies():
    pins = script("live_assets").lock()
    files = pins["pyodide"]["files"]
    assert set(files) == {"pyodide.mjs", "pyodide.asm.js", "pyodide.asm.wasm", "python_stdlib.zip",
                          "pyodide-lock.json"}
    assert all(len(h) == 64 for h in files.values()) and pins["pyodide"]["integrity"].startswith("sha512-")
    names = {w["name"] for w in pins["wheels"]}
    assert names == {"plotly", "narwhals", "packaging", "lazy_loader"}
    for w in pins["wheels"]:
        assert w["file"].startswith(f"{w['name']}-{w['version']}-") and w["file"].endswith("-py3-none-any.whl")
        assert len(w["sha256"]) == 64


def test_nothing_fetched_means_everything_missing(tmp_path):
    assets = script("live_assets")
    assert len(assets.missing(tmp_path)) == 5 + len(assets.lock()["wheels"])


def test_live_mode_is_off_with_live_0_and_the_chapters_are_told(monkeypatch):
    mod = _live_mode()
    monkeypatch.setenv("PAGED_KV_LIVE", "0")
    assert mod.live_status() == (False, "PAGED_KV_LIVE=0")

    class App:
        pass

    app = App()
    mod._config_inited(app, None)
    assert app.paged_kv_live is False
    assert os.environ["PAGED_KV_LIVE"] == "0"
    context = {"body": '<div class="paged-kv-live" data-panel="calculator">', "script_files": []}
    mod._page_context(app, "p", "t", context, None)
    assert context["script_files"] == []               # no click listener in a build without live mode
    app.paged_kv_live = True
    mod._page_context(app, "p", "t", context, None)
    assert context["script_files"] == ["_static/live/click.js"]
    plain = {"body": "<p>no panel</p>", "script_files": []}
    mod._page_context(app, "p", "t", plain, None)
    assert plain["script_files"] == []                 # a page without a panel loads nothing of it


def test_a_pure_wheel_without_the_panels_turns_live_mode_off(monkeypatch, tmp_path, live_assets):
    wheel = tmp_path / "paged_kv_pure-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("paged_kv/__init__.py", "")
    monkeypatch.setenv("PAGED_KV_PURE_WHEEL", str(wheel))
    monkeypatch.setenv("PAGED_KV_LIVE", "1")

    class App:
        pass

    app = App()
    _live_mode()._config_inited(app, None)
    assert app.paged_kv_live is False and os.environ["PAGED_KV_LIVE"] == "0"


def test_the_served_wheel_leaves_out_only_the_dropped_paths(tmp_path):
    src = tmp_path / "w-1.0-py3-none-any.whl"
    with zipfile.ZipFile(src, "w") as z:
        for name in ("w/__init__.py", "w/package_data/big.js", "w/package_data/templates/t.json",
                     "w-1.0.data/data/x.js", "w-1.0.dist-info/METADATA"):
            z.writestr(name, name)
    out = tmp_path / "out.whl"
    _live_mode()._copy_wheel(src, out, ["w/package_data/big.js", "w-1.0.data/"])
    assert sorted(zipfile.ZipFile(out).namelist()) == ["w-1.0.dist-info/METADATA", "w/__init__.py",
                                                       "w/package_data/templates/t.json"]
    assert zipfile.ZipFile(out).read("w/__init__.py") == b"w/__init__.py"
    drops = {w["name"]: w.get("drop", []) for w in json.loads((ROOT / "book/_ext/live/lock.json").read_text())["wheels"]}
    assert not any(d.startswith("plotly/package_data/templates") for d in drops["plotly"])  # the book's template


def test_the_bytecode_key_follows_the_pure_wheels_sources_not_its_timestamps(tmp_path, pure_wheel):
    assets = script("live_assets")

    def rewrite(out, change=None):
        with zipfile.ZipFile(pure_wheel) as zin, zipfile.ZipFile(out, "w") as zout:
            for info in zin.infolist():
                data = zin.read(info)
                if info.filename == change:
                    data += b"\n# another source\n"
                zout.writestr(zipfile.ZipInfo(info.filename, (2030, 1, 1, 0, 0, 0)), data)   # other timestamps
        return out

    key = assets.bytecode_key(pure_wheel)
    assert assets.bytecode_key(rewrite(tmp_path / "same.whl")) == key
    assert assets.bytecode_key(rewrite(tmp_path / "changed.whl", "paged_kv/panels/worker.py")) != key


@pytest.mark.skipif(NODE is None, reason="Debian's nodejs is not installed: no precompiled bytecode")
def test_the_bytecode_covers_every_module_of_the_pure_wheel_checked_against_its_source(live_assets, pure_wheel):
    """Every module of the pure wheel has a checked-hash .pyc (Python runs it only for the source
    it was compiled from), the pinned wheels' modules a panel loads unchecked-hash ones, all of
    them with the magic number of one Python, Pyodide's."""
    made = script("live_assets").bytecode(pure_wheel)
    assert made is not None and made.name == f"{script('live_assets').bytecode_key(pure_wheel)}.zip"
    tag = "cpython-" + script("live_assets").lock()["pyodide"]["python"].replace(".", "")
    with zipfile.ZipFile(made) as z:
        headers = {name: z.read(name)[:8] for name in z.namelist()}
    own = [n for n in zipfile.ZipFile(pure_wheel).namelist() if n.endswith(".py")]
    for src in own:
        folder, _, file = src.rpartition("/")
        assert headers[f"{folder}/__pycache__/{file[:-3]}.{tag}.pyc"][4:8] == (3).to_bytes(4, "little"), src
    theirs = [n for n in headers if not n.startswith("paged_kv/")]
    assert "plotly/__pycache__/__init__.%s.pyc" % tag in theirs and len(theirs) > 200
    assert {headers[n][4:8] for n in theirs} == {(1).to_bytes(4, "little")}
    assert len({h[:4] for h in headers.values()}) == 1
