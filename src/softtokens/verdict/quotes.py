"""The paper's quoted lines as a shipped excerpt, made from the paper's LaTeX source wherever a user
has it.

Why: every claim quotes the paper with the line it starts on, and a test checks each quote against
those lines; the paper is not part of a clone, so the lines it quotes ship as an excerpt
(tests/fixtures/paper_quotes.json). `softtokens quotes --tex PATH --write` (or SOFTTOKENS_PAPER_TEX)
remakes it from a copy of the source; without a copy the shipped excerpt is what the test reads.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

ENV = "SOFTTOKENS_PAPER_TEX"
TEX_NAME = "soft-tokens-hard-truths.tex"
EXCERPT = Path("tests/fixtures/paper_quotes.json")   # from the repository root
CONTEXT_LINES = 4                                    # a quote may run over this many source lines


def paper_tex(given: str | Path | None = None) -> Path | None:
    """The source to read: ``given``, else $SOFTTOKENS_PAPER_TEX, else ../shared/paper beside the
    repository; None where none exists (an explicitly given path that does not exist is an error)."""
    explicit = given or os.environ.get(ENV)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise FileNotFoundError(f"the paper's source {path} does not exist (from {'--tex' if given else ENV})")
        return path
    beside = Path(__file__).resolve().parents[4] / "shared" / "paper" / TEX_NAME
    return beside if beside.is_file() else None


def quoted_lines() -> list[int]:
    """Every source line a claim's quote may cover (its first line and the next few)."""
    from softtokens.verdict.claims import registry

    firsts = {int(q["where"].rsplit("line ", 1)[1].rstrip(")")) for d in registry() for q in d.quotes}
    return sorted({n for line in firsts for n in range(line, line + CONTEXT_LINES)})


def excerpt(tex: Path) -> dict:
    """The excerpt of ``tex`` the claims quote: its name, sha256 and the quoted lines by number."""
    lines = tex.read_text().splitlines()
    return {"source": tex.name, "sha256": hashlib.sha256(tex.read_bytes()).hexdigest(),
            "lines": {str(n): lines[n - 1] for n in quoted_lines()}}


def write_excerpt(tex: Path, out: Path = EXCERPT) -> bool:
    """Rewrite ``out`` from ``tex``; True when it changed."""
    text = json.dumps(excerpt(tex), indent=1, ensure_ascii=False) + "\n"
    if out.is_file() and out.read_text() == text:
        return False
    out.write_text(text)
    return True
