"""Screenshot of an HTML report, to commit beside a showcase report (run from the repository root):

    python -m tools.screenshot reports/NAME.html reports/NAME.png [--width 1360] [--viewport-only]

Needs the test extra (playwright) and the system's Chromium, as the browser tests do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.browser import BrowserMissing, launch

__all__ = ["screenshot", "main"]


def screenshot(html: Path, png: Path, *, width: int = 1360, height: int = 900, full_page: bool = True) -> Path:
    png.parent.mkdir(parents=True, exist_ok=True)
    with launch() as browser:
        page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)
        page.goto(Path(html).resolve().as_uri(), wait_until="load")
        page.screenshot(path=str(png), full_page=full_page, animations="disabled")
    return png


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.screenshot", description=__doc__.split("\n\n")[0])
    ap.add_argument("html", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--width", type=int, default=1360, help="viewport width in CSS pixels (default 1360)")
    ap.add_argument("--height", type=int, default=900, help="viewport height, for --viewport-only (default 900)")
    ap.add_argument("--viewport-only", action="store_true", help="only the first screen, not the whole page")
    args = ap.parse_args(argv)
    if not args.html.exists():
        print(f"no such file: {args.html}", file=sys.stderr)
        return 2
    try:
        out = screenshot(args.html, args.png, width=args.width, height=args.height, full_page=not args.viewport_only)
    except BrowserMissing as e:
        print(f"screenshot: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
