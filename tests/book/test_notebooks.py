"""The Colab notebooks book/*.ipynb stay in sync with their MyST sources and carry no outputs."""

import json
import re

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
    installs = re.findall(r'"paged-kv @ git\+([^"]+)"', text)
    assert installs == [url], f"{src}: install cell must install from {url}, found {installs}"
    assert "enable_custom_widget_manager" in text
    ipynb_path = ROOT / f"{src}.ipynb"
    if ipynb_path.exists():
        nb = json.loads(ipynb_path.read_text())
        assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")
        assert nb["metadata"]["kernelspec"]["name"] == "python3"
