"""Screenshot an HTML page (the reproduction report, Snakemake's report) with a real headless
browser, to look at it as a reader would.

Why a browser and not the HTML text: Snakemake's report is a JavaScript application; what a reader
sees exists only once it has run. Debian's chromium (``apt-get install chromium``) is used; the
page is given a virtual-time budget so its scripts finish before the capture.

    python analysis/screenshot.py results/toy/report/reproduction.html /tmp/reproduction.png
    python analysis/screenshot.py results/toy/report.html /tmp/snakemake_report.png --height 1400
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit(f"no headless browser found (tried {', '.join(BROWSERS)}); on Debian: apt-get install chromium")


def screenshot(page: Path, out: Path, width: int = 1400, height: int = 2400, wait_ms: int = 8000) -> Path:
    browser = find_browser()
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={profile}", f"--window-size={width},{height}",
               f"--virtual-time-budget={wait_ms}", f"--screenshot={out}", page.resolve().as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"{browser} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=2400)
    ap.add_argument("--wait-ms", type=int, default=8000, help="virtual time for the page's scripts")
    a = ap.parse_args()
    if not a.page.exists():
        raise SystemExit(f"no such page: {a.page}")
    print(screenshot(a.page, a.out, a.width, a.height, a.wait_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
