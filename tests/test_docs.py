"""The numbers the docs quote from the code are the code's: every generated block (report.doc_blocks)
is what `softtokens docs --write` would write now."""

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
    assert doc_blocks.stale(tmp_path) == ["docs/protocol.md: paper-claims"]
    assert doc_blocks.write(tmp_path) == ["docs/protocol.md"] and doc_blocks.stale(tmp_path) == []
    page.write_text(page.read_text().replace("<!-- end generated: paper-claims -->", ""))
    assert "no markers" in doc_blocks.stale(tmp_path)[0]
