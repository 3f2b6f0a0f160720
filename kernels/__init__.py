"""Triton kernels for paged-kv, one kernel per file, each with a plain PyTorch reference.

Importing this package first imports :mod:`kernels.runtime`, which decides once where the
kernels run (compiled on CUDA, the Triton interpreter on CPU) before Triton itself is imported.

The import name ``kernels`` is also that of an unrelated PyPI distribution (``pip install
kernels``, Hugging Face's kernel downloader).  Installed into the same environment, the two
write into the same ``site-packages/kernels/`` folder and overwrite each other's files, so this
package refuses to import when it finds that distribution's files in its own folder (see the
README, "The kernels name").
"""

from pathlib import Path as _Path


def _check_ours() -> None:
    """Raise ImportError if the PyPI distribution ``kernels`` owns files in this folder."""
    from importlib import metadata

    here = _Path(__file__).resolve().parent
    try:
        dist = metadata.distribution("kernels")
    except metadata.PackageNotFoundError:
        return
    if any(_Path(dist.locate_file(f)).resolve().parent == here for f in dist.files or ()
           if f.parts[:1] == ("kernels",)):
        raise ImportError(
            f"{here} holds files of two packages: paged-kv's kernels and the PyPI distribution "
            f"'kernels' {dist.version}, which share the import name 'kernels' and overwrite each "
            "other's files. Use a separate environment for one of them, or run `pip uninstall -y "
            "kernels paged-kv` and reinstall paged-kv.", name="kernels")


_check_ours()
# kernels.runtime checks this flag: when the other distribution's __init__.py replaced this one,
# the flag is missing and importing any of our kernel modules raises (README, "The kernels name").
_PAGED_KV = True

from . import runtime  # noqa: E402,F401  (must run before anything imports triton)
