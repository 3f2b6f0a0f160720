"""The Colab notebooks book/*.ipynb stay in sync with their MyST sources and carry no outputs."""

import json
import re
import sys

import jupytext
import nbformat
import pytest
import yaml

from conftest import ROOT, toc_files

PAGES = toc_files()


def _cells(nb):
    return [(c.cell_type, c.source.strip(), sorted(c.metadata.get("tags", []))) for c in nb.cells]


@pytest.mark.parametrize("src", PAGES)
def test_ipynb_matches_markdown_source(src):
    md = jupytext.read(ROOT / f"{src}.md")
    ipynb_path = ROOT / f"{src}.ipynb"
    assert ipynb_path.is_file(), f"{ipynb_path.name} missing: run `make sync`"
    ipynb = nbformat.read(ipynb_path, as_version=4)
    assert _cells(ipynb) == _cells(md), f"{src}.ipynb is out of date: run `make sync`"


@pytest.mark.parametrize("src", PAGES)
def test_sources_have_no_outputs_and_install_from_configured_repo(src):
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    url = cfg["repository"]["url"]
    text = (ROOT / f"{src}.md").read_text()
    assert re.findall(r'^REPO = "([^"]+)"', text, re.M) == [url], f"{src}: set-up cell must install from {url}"
    assert "enable_custom_widget_manager" in text
    ipynb_path = ROOT / f"{src}.ipynb"
    if ipynb_path.exists():
        nb = json.loads(ipynb_path.read_text())
        assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")
        assert nb["metadata"]["kernelspec"]["name"] == "python3"
        # On Colab the set-up is one cell, shown as a form (its code hidden), that displays no value.
        first = [c for c in nb["cells"] if c["cell_type"] == "code"][0]
        src_lines = "".join(first["source"]).splitlines()
        assert re.match(r'# @title .*\{ display-mode: "form" \}$', src_lines[0]), src_lines[0]
        assert "remove-cell" in first["metadata"].get("tags", [])
        assert not re.match(r"[\w.]+\(.*\)$", src_lines[-1]), f"the set-up cell's last line shows a value: {src_lines[-1]}"


def test_setup_cells_readme_and_urls_follow_the_one_configured_url():
    sys.path.insert(0, str(ROOT / "scripts"))
    import setup_cell
    assert setup_cell.stale() == [], "run python scripts/setup_cell.py, then make sync and make assignments"
    url = setup_cell.repo_url()
    readme = (ROOT / "README.md").read_text()
    for form in setup_cell._github_forms(url):
        assert form in readme, f"README.md does not mention {form}"
    # The generator follows a new URL everywhere (on a copy of the files).
    fork = "https://github.com/someone/paged-kv-fork"
    text = (ROOT / "book" / "05_paged_attention.md").read_text()
    assert f'REPO = "{fork}"' in setup_cell.rewrite_book(text, fork)
    assert setup_cell.rewrite_book(setup_cell.rewrite_book(text, fork), url) == text
    assert fork in setup_cell.rewrite_urls(readme, fork, url) and url not in setup_cell.rewrite_urls(readme, fork, url)
    # Every file the generator writes says the fork, and no other text in the sources keeps the old URL
    # (a new-user trial found the teacher guide's `git clone` left behind).
    for path, rewrite in setup_cell.targets():
        new = rewrite(path.read_text(), fork)
        assert url not in new.replace(fork, ""), f"{path.relative_to(ROOT)} keeps {url} after the rewrite"
    owned = {path for path, _ in setup_cell.targets()}
    for path in [*ROOT.glob("book/*.md"), *ROOT.glob("assignments/source/*/*.md"), ROOT / "_toc.yml"]:
        assert path in owned or url not in path.read_text(), f"{path.relative_to(ROOT)} names {url}, not rewritten"


def _setup_code():
    cell = [c for c in nbformat.read(ROOT / "book" / "05_paged_attention.ipynb", as_version=4).cells
            if c.cell_type == "code"][0]
    return cell.source.split("\nfrom paged_kv import viz")[0]   # the install part


# Runs the set-up cell as Colab would (a stand-in google.colab, paged-kv not installed yet) in an
# IPython shell, and prints what the reader would see.
_COLAB_SHELL = """
import importlib.metadata as md, io, sys, types, contextlib, subprocess
colab = types.ModuleType("google.colab"); colab.output = types.SimpleNamespace(enable_custom_widget_manager=lambda: None)
sys.modules["google.colab"] = colab
real = md.distributions
md.distributions = lambda: [d for d in real() if d.metadata["Name"] != "paged-kv"]
MODE = sys.argv[1]
if MODE == "restart":   # pip 'upgrades' numpy, which this kernel has imported
    import numpy
    calls = []
    def fake_versions():
        calls.append(1)
        class D:
            def __init__(s, n, v): s.metadata, s.version = {"Name": n}, v
        return [D("numpy", "1.0" if len(calls) < 3 else "2.0")]
    md.distributions = fake_versions
    md.packages_distributions = lambda: {"numpy": ["numpy"]}
    subprocess.run = lambda *a, **k: subprocess.CompletedProcess(a, 0, "", "")
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    result = shell.run_cell(open(sys.argv[2]).read())
print("ERROR" if result.error_in_exec else "OK")
print(out.getvalue())
"""


@pytest.mark.parametrize("mode", ["bad-url", "restart"])
def test_setup_cell_stops_with_one_readable_message(mode, tmp_path):
    import os
    import subprocess
    import sys as _sys
    (tmp_path / "cell.py").write_text(_setup_code())
    (tmp_path / "shell.py").write_text(_COLAB_SHELL)
    env = dict(os.environ, PAGED_KV_REPO=f"file://{tmp_path}/no-such-repo")
    r = subprocess.run([_sys.executable, str(tmp_path / "shell.py"), mode, str(tmp_path / "cell.py")],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    shown = r.stdout
    assert shown.startswith("ERROR"), shown + r.stderr
    assert "Traceback" not in shown and "CalledProcessError" not in shown, shown
    if mode == "bad-url":
        assert "Could not install paged-kv from paged-kv @ git+file://" in shown
        assert "no-such-repo" in shown and "REPO" in shown and "wheel" in shown
    else:
        assert "upgraded numpy" in shown and "Restart the session" in shown


@pytest.mark.parametrize("venv", [".venv", ".colab-venv", "venv", "my-env"])
def test_the_book_build_skips_virtual_environments_in_the_clone(venv, tmp_path):
    """`make colab-check` leaves .colab-venv in the clone (and readers make their own venvs there):
    the strict build (-W) must not read their thousands of README/LICENSE files as pages."""
    from sphinx.util.matching import get_matching_files

    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "intro.md").write_text("# intro\n")
    site = tmp_path / venv / "lib" / "python3.11" / "site-packages" / "pkg"
    site.mkdir(parents=True)
    (site / "README.md").write_text("# not a page\n")
    (tmp_path / venv / "lib64").symlink_to(tmp_path / venv / "lib")   # as python -m venv makes it
    patterns = yaml.safe_load((ROOT / "_config.yml").read_text())["exclude_patterns"]
    assert sorted(get_matching_files(tmp_path, ("**.md",), patterns)) == ["book/intro.md"]
