"""Headless Chromium for looking at the HTML report: the browser tests and the screenshot tool.

Drives the system's Chromium (Debian's `chromium` package) through Playwright; never a downloaded
browser (`playwright install` is not needed). The flags keep it offline and quiet: no background
updates, sync or QUIC, so the only traffic left is what the page itself asks for.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager

__all__ = ["chromium_path", "launch", "FLAGS", "BrowserMissing"]

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


class BrowserMissing(RuntimeError):
    pass


def chromium_path() -> str | None:
    """$ZEROBENCH_CHROMIUM, else Debian's /usr/bin/chromium, else `chromium` on PATH."""
    env = os.environ.get("ZEROBENCH_CHROMIUM")
    if env:
        return env if os.path.exists(env) else None
    for p in _CANDIDATES:
        if os.path.exists(p):
            return p
    return shutil.which("chromium")


@contextmanager
def launch():
    """A Playwright Chromium browser on the system executable; closed on exit."""
    path = chromium_path()
    if path is None:
        raise BrowserMissing(
            "no Chromium found: install Debian's package (apt-get install -y chromium) "
            "or set ZEROBENCH_CHROMIUM to the executable"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        raise BrowserMissing(
            "the playwright package is missing: pip install -e '.[test]' (or pip install "
            "playwright; no `playwright install` needed)"
        ) from e
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()
