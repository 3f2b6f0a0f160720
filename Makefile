# paged-kv: `make book` builds the HTML book (every chapter executed), `make test` runs the tests.
# Both bootstrap a virtual environment in .venv on first use.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Which torch to install when the venv has none. On the book's CI machines this is a CPU build
# already on disk. Elsewhere, to avoid a multi-GB CUDA download, pass e.g.
#   make TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
JB_FLAGS ?= --all -W -n --keep-going

.PHONY: help install assets live-assets book test test-fast sync setup-cells colab-check assignments bench train pure-wheel clean

help:
	@echo "make install  only the virtual environment .venv with the package and its book/test extras"
	@echo "make book   build _build/html/index.html (all chapters executed, warnings are errors)"
	@echo "make test   run the test suite (kernels in the Triton interpreter, book build, browser)"
	@echo "make test-fast  the tests without the book build and the browser"
	@echo "make assets MathJax for offline pages, and live mode's Pyodide and wheels (needs npm; make book runs it)"
	@echo "make book LIVE=0  the book without live mode (its pages say so; no Pyodide fetched)"
	@echo "make sync   regenerate the Colab notebooks book/*.ipynb from the MyST sources book/*.md"
	@echo "make setup-cells  rewrite the Colab set-up cells and URLs from repository.url in _config.yml"
	@echo "make colab-check  every chapter live with Colab's packages, panels clicked in Chromium (slow, not in make test)"
	@echo "make assignments  build the graded assignments' nbgrader sources and their release (assignments/)"
	@echo "make bench  python -m kernels.bench"
	@echo "make pure-wheel  dist/paged_kv_pure-*.whl: the torch- and numpy-free modules (leaves, blocks, scheduling, memory, engine loop, figures, panels), no weights"
	@echo "make train  retrain the bundled tiny model (needs ../shared/data/tinyshakespeare.txt)"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@# Keep an importable torch; otherwise install TORCH_SPEC (never an unpinned CUDA build).
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[book,test]"
	@touch $(STAMP)

install: $(STAMP)

# MathJax 3 for offline math, unpacked from the npm registry's package (skipped without npm:
# then the pages load MathJax from its CDN, see book/_ext/offline_assets.py). It goes to
# _assets/, not _static/: Jupyter Book would add every .js under a root _static/ to each page.
MATHJAX_VERSION := 3.2.2
_assets/mathjax/tex-chtml.js:
	@if command -v npm >/dev/null 2>&1; then \
	  tmp=$$(mktemp -d) && (cd $$tmp && npm pack -q mathjax@$(MATHJAX_VERSION) >/dev/null) && \
	  tar xzf $$tmp/mathjax-$(MATHJAX_VERSION).tgz -C $$tmp && mkdir -p _assets/mathjax && \
	  for d in tex-chtml.js output input a11y ui adaptors; do cp -r $$tmp/package/es5/$$d _assets/mathjax/; done; \
	  rm -rf $$tmp; \
	else echo "npm not found: math will load MathJax from its CDN"; fi

# Live mode (README, "Live mode"): Pyodide's core files from the npm registry and the pure-Python
# wheels from PyPI, pinned and hashed in book/_ext/live/lock.json, fetched into .live_assets/ by
# scripts/live_assets.py; book/_ext/live_mode.py copies them into the site. Without npm (or with
# LIVE=0) nothing is fetched and the book builds without live mode.
LIVE ?= 1
live-assets: $(STAMP)
	@if [ "$(LIVE)" = "0" ]; then echo "LIVE=0: live mode is not in this build"; \
	elif command -v npm >/dev/null 2>&1; then $(BIN)/python scripts/live_assets.py; \
	else echo "npm not found: live mode is not in this build"; fi

assets: _assets/mathjax/tex-chtml.js live-assets

book: $(STAMP) assets
	PAGED_KV_BOOK=1 PAGED_KV_LIVE=$(LIVE) $(BIN)/jupyter-book build . $(JB_FLAGS)
	@echo "Open _build/html/index.html"

# One pytest worker per core (-n auto). --dist loadscope with the scopes of tests/conftest.py: a
# test file stays on one worker, the files that read the built book share one; the files with slow
# tests start first (--no-loadscope-reorder keeps that order); each worker's torch gets its share
# of the cores.
PYTEST_PAR ?= -n auto --dist loadscope --no-loadscope-reorder
test: $(STAMP) assets
	$(BIN)/python -m pytest $(PYTEST_PAR)

test-fast: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_PAR) -m "not book and not browser"

# --update keeps the notebooks' cell ids (and so Colab's and git's view of each cell) stable.
sync: $(STAMP)
	$(BIN)/jupytext --update --to ipynb --update-metadata '{"jupytext": null}' book/*.md

# The set-up cells, the assignments' install lines and the README/pyproject URLs, from the one
# repository.url in _config.yml (then `make sync` and `make assignments`).
setup-cells: $(STAMP)
	$(BIN)/python scripts/setup_cell.py

# Colab's own package versions, a CPU torch (TORCH_SPEC, never a CUDA build), the package
# installed by the set-up cell's pip command from this clone's HEAD, every chapter executed live,
# every live panel clicked in JupyterLab in headless Chromium. Not part of `make test` (slow).
CHROMIUM ?= $(shell command -v chromium || command -v chromium-browser)
colab-check:
	$(PYTHON) scripts/colab_check.py --venv .colab-venv --torch "$(TORCH_SPEC)" --chromium "$(CHROMIUM)"

# The graded assignments: assignments/source/*/*.md -> nbgrader source notebooks -> release/
# (nbgrader generate_assignment). See the book's teacher guide.
assignments: $(STAMP)
	$(BIN)/python assignments/course.py release

# The pure layers as their own small wheel (no torch, no numpy, no weights; for the browser build,
# issue 24): see scripts/pure_wheel.py.
pure-wheel: $(STAMP)
	$(BIN)/python scripts/pure_wheel.py dist

bench: $(STAMP)
	$(BIN)/python -m kernels.bench

train: $(STAMP)
	$(BIN)/python scripts/train_tiny.py --data ../shared/data/tinyshakespeare.txt --out paged_kv/model/weights

clean:
	rm -rf _build _assets/mathjax .live_assets
