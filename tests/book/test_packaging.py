"""The wheel a reader installs (e.g. pip install on Colab) carries every module and the weights.

Editable installs (make, CI) cannot show a package missing from the wheel, so build one.
"""

import subprocess
import sys
import zipfile

from conftest import ROOT


def test_wheel_has_every_module_and_the_checkpoint(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("paged_kv-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {p.relative_to(ROOT).as_posix() for pkg in ("paged_kv", "kernels")
                for p in (ROOT / pkg).rglob("*.py")}
    expected |= {f"paged_kv/model/weights/{f}" for f in ("tiny-shakespeare.safetensors", "config.json", "MODEL_CARD.md")}
    missing = sorted(expected - names)
    assert not missing, f"missing from the wheel: {missing}"
    assert not any(n.startswith(("tests/", "book/", "scripts/")) for n in names)


def _import_kernels(site, tmp_path):
    import os
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{ROOT}", TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "-c", "import kernels, sys; print(kernels.__file__)"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_import_kernels_refuses_a_folder_shared_with_the_pypi_kernels_package(tmp_path):
    """`pip install kernels` (another project) writes into the same kernels/ folder as ours."""
    import shutil
    site = tmp_path / "site"
    shutil.copytree(ROOT / "kernels", site / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    ok = _import_kernels(site, tmp_path)        # ours alone: imports
    assert ok.returncode == 0 and ok.stdout.strip() == str(site / "kernels" / "__init__.py"), ok.stderr
    info = site / "kernels-0.4.0.dist-info"      # now the other distribution's record claims files there
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.4.0\n")
    (info / "RECORD").write_text("kernels/__init__.py,,\nkernels/layer.py,,\nkernels-0.4.0.dist-info/RECORD,,\n")
    bad = _import_kernels(site, tmp_path)
    assert bad.returncode != 0
    last = bad.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:") and "'kernels' 0.4.0" in last and "pip uninstall" in last, bad.stderr


def test_importing_our_kernel_modules_refuses_the_other_packages_init(tmp_path):
    """The other order: `pip install kernels` after paged-kv, so its __init__.py replaced ours while our
    kernel modules stayed; paged_kv's kernels then refuse to load instead of running under a foreign
    package (found by a new-user trial: it used to work silently)."""
    import os
    import shutil
    site = tmp_path / "site"
    shutil.copytree(ROOT / "kernels", site / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "kernels" / "__init__.py").write_text('"""Another project\'s kernels package."""\n__version__ = "0.4.0"\n')
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{ROOT}", TRITON_INTERPRET="1")
    for code in ("import kernels.runtime", "import paged_kv; from paged_kv.decoding import generate"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                             timeout=300)
        assert out.returncode != 0, f"{code!r} ran under the other package's __init__.py"
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("ImportError:") and "not paged-kv's" in last and "pip uninstall" in last, out.stderr
