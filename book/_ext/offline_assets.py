"""Sphinx extension: serve plotly.js and MathJax from the built site, so pages work offline.

* plotly.js is copied from the installed ``plotly`` package into ``_static/`` and loaded once per
  page; figures are emitted without their own copy (see ``paged_kv.viz.setup_plotly``).
* repeated ``<script>`` entries are dropped (see :func:`_dedupe_scripts`).
* ``html_static_path`` (``_assets/``: the book's CSS, MathJax) is found from the repository root
  also when one page is built alone (``jupyter-book build book/07_serving.md``), whose source
  folder is ``book/``: there it was missing, the page had no CSS and ``-W`` failed on the warning.
* MathJax 3 is used from ``_assets/mathjax/`` (served as ``_static/mathjax/``) when ``make book`` could unpack it there (it takes
  it from the npm registry); otherwise Sphinx's default CDN address stays, and the build says so.
"""

from pathlib import Path
import shutil

from sphinx.util import logging

LOG = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]              # the repository (this file: book/_ext/)
MATHJAX = Path("_assets") / "mathjax" / "tex-chtml.js"  # html_static_path: lands in _static/


def _config_inited(app, config):
    base = Path(app.confdir or app.srcdir)
    config.html_static_path = [p if Path(p).is_absolute() or (base / p).exists() or not (ROOT / p).exists()
                               else str(ROOT / p) for p in config.html_static_path]
    if (ROOT / MATHJAX).is_file():
        config.mathjax_path = "mathjax/tex-chtml.js"
    else:
        LOG.info("offline_assets: no %s; MathJax will load from its CDN", MATHJAX)


def _builder_inited(app):
    if app.builder.format == "html":
        app.add_js_file("plotly.min.js")


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    """Drop repeated script entries: sphinx-thebe registers its inline config twice under
    Jupyter Book, and the second ``const THEBE_JS_URL`` is a JavaScript error on every page."""
    seen, unique = set(), []
    for script in context.get("script_files", []):
        body = getattr(script, "attributes", {}).get("body")
        key = ("body", body) if body else ("src", str(script))  # inline: filename None or ''
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def _build_finished(app, exception):
    if exception is None and app.builder.format == "html":
        import plotly

        src = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
        dest = Path(app.outdir) / "_static"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest / "plotly.min.js")


def setup(app):
    app.connect("config-inited", _config_inited)
    app.connect("builder-inited", _builder_inited)
    app.connect("html-page-context", _dedupe_scripts)
    app.connect("build-finished", _build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
