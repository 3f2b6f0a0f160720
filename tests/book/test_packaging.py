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
