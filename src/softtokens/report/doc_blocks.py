"""Numbers in the docs that the code can compute: written between markers by `softtokens docs --write`,
held equal to the code by `softtokens docs` (and tests/test_docs.py).

Why: a number typed into a page drifts from the code that makes it (a job count, a verdict on the
paper's numbers). A block is the text between

    <!-- generated: NAME (softtokens docs --write) -->
    ...
    <!-- end generated: NAME -->

in a file of the repository; its text is BLOCKS[NAME]() and nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

BEGIN = "<!-- generated: {name} (softtokens docs --write) -->"
END = "<!-- end generated: {name} -->"


def paper_claims_block() -> str:
    """Every claim on the paper's own numbers: the verdict and each end's counts (report.claims)."""
    import pandas as pd

    from softtokens.report.claims import judge_paper_claims
    from softtokens.report.judging import ENDS, NOT_JUDGED
    from softtokens.report.paper import load_paper_results

    rows = []
    for c in judge_paper_claims(load_paper_results()):
        words = "; ".join(f"\"{q['text']}\" ({q['where'].rsplit('line ', 1)[1].rstrip(')')})" for q in c.quotes)
        ends = {end: "-" if c.verdict == NOT_JUDGED else
                c.ends[end]["verdict"] + (f" ({c.ends[end]['counts']})" if c.ends[end]["counts"] else "") for end in ENDS}
        rows.append({"claim": f"`{c.key}`", "the paper's words (line)": words, "verdict": f"**{c.verdict}**", **ends})
    return pd.DataFrame(rows).to_markdown(index=False)


BLOCKS: dict[str, Callable[[], str]] = {
    "paper-claims": paper_claims_block,
}

# which files hold which blocks (paths from the repository root)
FILES: dict[str, tuple[str, ...]] = {
    "docs/protocol.md": ("paper-claims",),
}


def _pattern(name: str) -> re.Pattern:
    return re.compile(re.escape(BEGIN.format(name=name)) + r"\n(.*?)\n?" + re.escape(END.format(name=name)), re.S)


def render(text: str, name: str) -> str:
    """``text`` with block ``name`` rewritten; a file without the block's markers is an error."""
    pattern = _pattern(name)
    if not pattern.search(text):
        raise KeyError(f"no markers for the generated block {name!r} ({BEGIN.format(name=name)})")
    body = BLOCKS[name]().rstrip("\n")
    return pattern.sub(lambda _: f"{BEGIN.format(name=name)}\n{body}\n{END.format(name=name)}", text, count=1)


def stale(root: Path) -> list[str]:
    """Every (file, block) whose text is not what the code gives now, as 'file: block' lines."""
    out = []
    for rel, names in FILES.items():
        path = root / rel
        text = path.read_text()
        for name in names:
            try:
                if render(text, name) != text:
                    out.append(f"{rel}: {name}")
            except KeyError as err:
                out.append(f"{rel}: {err.args[0]}")
    return out


def write(root: Path) -> list[str]:
    """Rewrite every block in place; the files changed."""
    changed = []
    for rel, names in FILES.items():
        path = root / rel
        text = new = path.read_text()
        for name in names:
            new = render(new, name)
        if new != text:
            path.write_text(new)
            changed.append(rel)
    return changed
