"""The numbers the docs quote from the code are the code's: every generated block (report.doc_blocks)
is what `softtokens docs --write` would write now."""

import re
from pathlib import Path

from softtokens.report import doc_blocks

ROOT = Path(__file__).resolve().parents[1]


def test_every_generated_block_is_current():
    assert doc_blocks.stale(ROOT) == [], "run `softtokens docs --write` and commit the result"


def test_a_stale_block_is_found_and_rewritten(tmp_path):
    for rel in doc_blocks.FILES:
        target = tmp_path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((ROOT / rel).read_text())
    page = tmp_path / "docs/protocol.md"
    page.write_text(page.read_text().replace("| **supported**", "| **supported (typed by hand)**", 1))
    plan = tmp_path / "docs/cluster.md"
    plan.write_text(plan.read_text().replace("| total ", "| total (typed) ", 1))
    assert doc_blocks.stale(tmp_path, ROOT) == ["docs/protocol.md: paper-claims", "docs/cluster.md: paper-plan"]
    assert doc_blocks.write(tmp_path, ROOT) == ["docs/protocol.md", "docs/cluster.md"]
    assert doc_blocks.stale(tmp_path, ROOT) == []
    page.write_text(page.read_text().replace("<!-- end generated: paper-claims -->", ""))
    assert "no markers" in doc_blocks.stale(tmp_path, ROOT)[0]


def test_the_plan_table_is_the_dry_runs():
    """The paper grid's job counts in docs/cluster.md come from the DAG: Table 1's 45 runs, 48 models
    evaluated under every inference setting on three benchmarks and on three out-of-domain sets."""
    from softtokens.run.names import SETTINGS

    counts = doc_blocks.dry_run_counts(ROOT, "--profile", "slurm")
    assert (counts["train"], counts["evaluate"], counts["evaluate_loglik"]) == (45, 48 * 3 * len(SETTINGS), 48 * 3)
    block = doc_blocks.paper_plan_block(ROOT)
    assert re.search(rf"\|\s*total\s*\|\s*{counts['total']}\s*\|", block)
