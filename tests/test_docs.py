"""The numbers the docs quote from the code are the code's: every generated block (report.doc_blocks)
is what `softtokens docs --write` would write now."""

import re
from pathlib import Path

import pytest
from softtokens.report import doc_blocks

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_generated_block_is_current():
    assert doc_blocks.stale(ROOT) == [], "run `softtokens docs --write` and commit the result"


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_plan_table_is_the_dry_runs():
    """The paper grid's job counts in docs/cluster.md come from the DAG: Table 1's 45 runs, 48 models
    evaluated under every inference setting on three benchmarks and on three out-of-domain sets."""
    from softtokens.config.names import SETTINGS

    counts = doc_blocks.dry_run_counts(ROOT, "--profile", "slurm")
    assert (counts["train"], counts["evaluate"], counts["evaluate_loglik"]) == (45, 48 * 3 * len(SETTINGS), 48 * 3)
    block = doc_blocks.paper_plan_block(ROOT)
    assert re.search(rf"\|\s*total\s*\|\s*{counts['total']}\s*\|", block)


DAG_MODULES = ("test_tiny_dag.py", "test_dag_faults.py", "test_dag_audit.py")   # the readers of the shared tiny DAG


def test_every_refusal_in_the_reliability_doc_names_an_attack_and_an_honest_twin_that_exist():
    """docs/reliability.md's "Every refusal beside its honest twin": each row names at least one test of the attack
    and one of the legitimate case, and each named test exists (a bare name: a module of the tiny DAG's,
    tests/shared_dag.py)."""
    import re

    root = Path(__file__).resolve().parents[1]
    doc = (root / "docs/reliability.md").read_text()
    section = doc.split("## Every refusal beside its honest twin")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| refusal")
            and not line.startswith("|---")]
    assert len(rows) >= 20
    defined = {}
    for f in (root / "tests").glob("test_*.py"):
        defined[f.name] = set(re.findall(r"^def (test_\w+)", f.read_text(), re.M))
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 3, row
        for cell in cells[1:]:
            named = re.findall(r"`(?:tests/(test_\w+\.py)::)?(test_\w+)`", cell)
            assert named, (row, cell)
            for module, test in named:
                modules = [module] if module else DAG_MODULES
                assert any(test in defined[m] for m in modules), (modules, test)
