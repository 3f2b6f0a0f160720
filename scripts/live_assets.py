"""Fetch the browser edition's runtime into ``.live_assets/`` (git-ignored), every hash checked.

What is fetched is pinned in ``book/_ext/live/lock.json``:

* Pyodide's core files (``pyodide.mjs``, ``pyodide.asm.js``, ``pyodide.asm.wasm``,
  ``python_stdlib.zip``, ``pyodide-lock.json``) from the npm registry's ``pyodide`` package,
  by ``npm pack pyodide@VERSION`` (the tarball's sha512 checked against the lock's npm
  integrity, then each file's sha256); nothing else of the package is kept;
* the pure-Python wheels the panels import (plotly and its dependencies, lazy_loader) from PyPI, by
  ``pip download --no-deps`` with a hash-pinned requirements file (pip checks the sha256; so does
  this script).

The book's build then asks :func:`bytecode` for the precompiled bytecode of the pure wheel it
serves: with Debian's nodejs, ``scripts/live_bytecode.mjs`` compiles in Pyodide itself the modules
of those wheels that a panel loads and every module of the pure wheel, into
``.live_assets/bytecode/<key>.zip``, kept for as long as the pins, the script and the package's
sources are those of the key (optional: a cold start without it compiles them from source, seconds
slower).

Without npm, or when a fetch fails, it says so and exits 0 without leaving a partial folder: the
book then builds without live mode (its pages say "Live mode is not in this build").  A second run
with everything in place does nothing.  ``make assets`` (and so ``make book``) runs it unless
``LIVE=0``.

Usage: ``python scripts/live_assets.py [DEST]`` (default ``.live_assets/``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "book" / "_ext" / "live" / "lock.json"
DEST = ROOT / ".live_assets"


def lock() -> dict:
    """The pins of ``book/_ext/live/lock.json``."""
    return json.loads(LOCK.read_text())


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def expected(dest: Path = DEST, pins: dict | None = None) -> dict[Path, str]:
    """Every file the runtime needs under ``dest`` -> its sha256: ``pyodide/<file>`` and ``wheels/<file>``."""
    pins = pins or lock()
    out = {dest / "pyodide" / name: digest for name, digest in pins["pyodide"]["files"].items()}
    out.update({dest / "wheels" / w["file"]: w["sha256"] for w in pins["wheels"]})
    return out


def missing(dest: Path = DEST, check_hashes: bool = False) -> list[str]:
    """The runtime files absent under ``dest`` (with ``check_hashes``, also those whose sha256 is
    not the lock's), as paths relative to ``dest``; ``[]`` when the runtime is complete."""
    return [str(p.relative_to(dest)) for p, digest in expected(dest).items()
            if not p.is_file() or (check_hashes and sha256(p) != digest)]


def _fetch_pyodide(pins: dict, out: Path, tmp: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm not found")
    spec = f"{pins['package']}@{pins['version']}"
    proc = subprocess.run([npm, "pack", "-q", spec], cwd=tmp, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"npm pack {spec} failed: {proc.stderr[-800:]}")
    tgz = tmp / proc.stdout.strip().splitlines()[-1]
    algo, _, want = pins["integrity"].partition("-")
    got = base64.b64encode(hashlib.new(algo, tgz.read_bytes()).digest()).decode()
    if got != want:
        raise RuntimeError(f"{tgz.name}: {algo} {got} is not the lock's {want}")
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tgz) as tar:
        for name, digest in pins["files"].items():
            member = tar.extractfile(f"package/{name}")
            if member is None:
                raise RuntimeError(f"{spec} has no {name}")
            data = member.read()
            if hashlib.sha256(data).hexdigest() != digest:
                raise RuntimeError(f"{spec}'s {name}: sha256 is not the lock's {digest}")
            (out / name).write_bytes(data)


def _fetch_wheels(wheels: list, out: Path, tmp: Path) -> None:
    req = tmp / "requirements.txt"
    req.write_text("".join(f"{w['name']}=={w['version']} --hash=sha256:{w['sha256']}\n" for w in wheels))
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                           "--require-hashes", "-r", str(req), "-d", str(tmp / "wheels")],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download failed: {proc.stderr[-800:]}")
    out.mkdir(parents=True, exist_ok=True)
    for w in wheels:
        got = tmp / "wheels" / w["file"]
        if not got.is_file() or sha256(got) != w["sha256"]:
            raise RuntimeError(f"{w['file']}: missing or its sha256 is not the lock's")
        shutil.copy2(got, out / w["file"])


BYTECODE_KEEP = 4          # zips kept in dest/bytecode/: a few pure wheels (builds, tests) at once


def bytecode_key(wheel: Path) -> str:
    """What the bytecode for ``wheel`` (a pure wheel) is made from: the sha256 of the lock (Pyodide
    and the pinned wheels), of ``scripts/live_bytecode.mjs`` and of every ``.py`` file in
    ``wheel`` (by name and content: a rebuilt wheel of the same sources keeps its bytecode)."""
    h = hashlib.sha256(LOCK.read_bytes() + (ROOT / "scripts" / "live_bytecode.mjs").read_bytes())
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(n for n in z.namelist() if n.endswith(".py")):
            h.update(name.encode() + b"\0" + hashlib.sha256(z.read(name)).digest())
    return h.hexdigest()


def bytecode(wheel: Path, dest: Path = DEST) -> Path | None:
    """The precompiled bytecode for the runtime under ``dest`` and the pure wheel ``wheel``, made
    by ``scripts/live_bytecode.mjs`` (in Pyodide, with Debian's nodejs) unless
    ``dest/bytecode/<key>.zip`` is there already (:func:`bytecode_key`: a changed source of the
    package, pin or script makes a new one); None without node or when it fails (said).  The
    package's own ``.pyc`` files in it are checked-hash, so even a zip made for other sources
    would never run them (see the script)."""
    folder = dest / "bytecode"
    out = folder / f"{bytecode_key(wheel)}.zip"
    if out.is_file():
        return out
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        print("live_assets: node not found: no precompiled bytecode (live mode starts slower)")
        return None
    folder.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(f".{os.getpid()}.part")
    proc = subprocess.run([node, str(ROOT / "scripts" / "live_bytecode.mjs"), str(dest), str(wheel), str(part)],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not part.is_file():
        part.unlink(missing_ok=True)
        print(f"live_assets: precompiling failed (live mode starts slower): {proc.stderr[-600:]}")
        return None
    part.replace(out)                        # whole or not at all, for a build running at the same time
    for old in sorted(folder.glob("*.zip"), key=lambda p: p.stat().st_mtime)[:-BYTECODE_KEEP]:
        old.unlink(missing_ok=True)
    print(proc.stdout.strip().splitlines()[-1])
    return out


def fetch(dest: Path = DEST) -> bool:
    """Fetch whatever is missing or wrong under ``dest``; True when the runtime is complete.
    A failure is printed, the partial files removed, and False returned (never raised)."""
    dest = Path(dest)
    if not missing(dest, check_hashes=True):
        return True
    pins = lock()
    with tempfile.TemporaryDirectory() as t:
        tmp, stage = Path(t), Path(t) / "stage"
        try:
            _fetch_pyodide(pins["pyodide"], stage / "pyodide", tmp)
            _fetch_wheels(pins["wheels"], stage / "wheels", tmp)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            print(f"live_assets: {e}; the book builds without live mode")
            return False
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(stage, dest)
    left = missing(dest, check_hashes=True)
    if left:
        print(f"live_assets: still missing {left}; the book builds without live mode")
        return False
    total = sum(p.stat().st_size for p in expected(dest))
    print(f"live_assets: Pyodide {pins['pyodide']['version']} and {len(pins['wheels'])} wheels in {dest} "
          f"({total / 1e6:.1f} MB)")
    return True


if __name__ == "__main__":
    fetch(Path(sys.argv[1]) if len(sys.argv) > 1 else DEST)
