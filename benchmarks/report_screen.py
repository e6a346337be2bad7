"""The reproduction report's first screen as a reader's browser shows it: Debian's headless chromium renders the page
at 1400 x 900, a script added to a copy of the page collects the text of every element in the first 900 pixels,
and a screenshot is kept beside it.

    python benchmarks/report_screen.py results/toy/report/reproduction.html
    python benchmarks/report_screen.py PAGE --out benchmarks/results/report_screen_toy

Checked (exit 1 and each failure named otherwise): the first screen names every claim's verdict in words, the wall
time waited and the job-hours, and the commit with its clean or dirty flag; no literal `**` or backtick anywhere in
the page's text (Markdown drawn, not shown). Needs `chromium` (apt-get install chromium); as root it runs with
--no-sandbox. Writes OUT.png (the screenshot) and OUT.json (the first screen's text and the checks)."""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

WIDTH, HEIGHT = 1400, 900
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}"]
MARKER = "softtokens-first-screen"
# run once the page has laid itself out: the text of every text node whose box is inside the viewport
COLLECT = f"""<script>
window.addEventListener('load', () => {{
  const seen = [], walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  let n;
  while ((n = walker.nextNode())) {{
    const r = document.createRange(); r.selectNodeContents(n);
    const b = r.getBoundingClientRect(), t = n.textContent.trim();
    if (t && b.height > 0 && b.top < {HEIGHT} && b.bottom > 0) seen.push(t);
  }}
  const pre = document.createElement('pre'); pre.id = '{MARKER}';
  pre.textContent = JSON.stringify({{viewport: [window.innerWidth, {HEIGHT}], text: seen}});
  document.body.appendChild(pre);
}});
</script>"""
VERDICT_WORDS = ("supported", "contradicted", "undecided", "not measured", "no information", "not judged")


class _Text(HTMLParser):
    """Every text node of a page, script and style left out."""

    def __init__(self):
        super().__init__()
        self.parts, self._skip = [], 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style") and self._skip > 0

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def page_text(page: str) -> str:
    p = _Text()
    p.feed(page)
    return "".join(p.parts)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not found:
        sys.exit("no chromium here: apt-get install chromium")
    return found


def first_screen(page: Path) -> dict:
    """{viewport, text}: what chromium shows of ``page`` without scrolling."""
    with tempfile.TemporaryDirectory(prefix="report-screen-") as tmp:
        copy = Path(tmp) / page.name
        text = page.read_text()
        copy.write_text(text.replace("</body>", COLLECT + "</body>") if "</body>" in text else text + COLLECT)
        for asset in page.parent.iterdir():   # links and images beside the page resolve as they would
            if asset != page and not (Path(tmp) / asset.name).exists():
                (Path(tmp) / asset.name).symlink_to(asset.resolve())
        dom = subprocess.run([chromium(), *FLAGS, "--virtual-time-budget=5000", "--dump-dom", copy.as_uri()],
                             capture_output=True, text=True, timeout=120).stdout
    m = re.search(rf'<pre id="{MARKER}">(.*?)</pre>', dom, re.S)
    if not m:
        sys.exit(f"chromium rendered {page} without running the collecting script")
    return json.loads(html.unescape(m.group(1)))


def screenshot(page: Path, png: Path) -> None:
    png.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([chromium(), *FLAGS, f"--screenshot={png}", page.resolve().as_uri()], capture_output=True,
                   timeout=120, check=True)


def checks(screen: dict, whole: str, claims: list[str]) -> dict[str, bool]:
    """What the first screen must say, each a named check."""
    seen = " ".join(screen["text"])
    out = {f"claim shown: {c[:60]}": c in seen for c in claims}
    out["every claim has a verdict in words"] = sum(seen.count(w) for w in VERDICT_WORDS) >= 2 * len(claims)
    out["wall time waited"] = "Wall time waited" in seen
    out["job-hours"] = "job-hours" in seen
    out["commit with its clean or dirty flag"] = bool(re.search(r"[0-9a-f]{7,10}\W*\s*\((clean|dirty)", seen))
    out["no literal ** in the page"] = "**" not in whole
    out["no literal backtick in the page"] = "`" not in whole
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("page", type=Path)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/report_screen"))
    p.add_argument("--claims", type=Path, default=None, help="the page's claims.json (default: beside the page)")
    a = p.parse_args(argv)
    claims_file = a.claims or a.page.with_name("claims.json")
    claims = [c["statement"] for c in json.loads(claims_file.read_text())["paper"]]   # the rows: the paper's words
    screen = first_screen(a.page)
    screenshot(a.page, a.out.with_suffix(".png"))
    result = checks(screen, page_text(a.page.read_text()), claims)
    a.out.with_suffix(".json").write_text(json.dumps({"page": str(a.page), "viewport": screen["viewport"],
                                                      "checks": result, "first_screen_text": screen["text"]},
                                                     indent=1) + "\n")
    failed = [k for k, ok in result.items() if not ok]
    print(f"{a.page}: first screen at {screen['viewport'][0]} x {screen['viewport'][1]}: "
          f"{len(result) - len(failed)} of {len(result)} checks hold; screenshot {a.out.with_suffix('.png')}")
    for k in failed:
        print(f"  FAILED: {k}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
