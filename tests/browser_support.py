"""What the browser tests share (tests/book/test_browser.py, tests/live/test_live_browser.py):
Debian's Chromium, launched headless the one way both use, and a quiet HTTP server on 127.0.0.1
for a built site (with the MIME types live mode's ``.mjs`` and ``.wasm`` files need)."""

import functools
import http.server
import shutil
import threading
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def launch_browser(playwright):
    """Headless Chromium for a module-scoped fixture (a generator: yields it, closes it after)."""
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


def serve(folder: Path):
    """Serve ``folder`` on 127.0.0.1 (a free port) in a daemon thread; returns ``(httpd, url)``."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                          ".mjs": "text/javascript", ".wasm": "application/wasm"}

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"
