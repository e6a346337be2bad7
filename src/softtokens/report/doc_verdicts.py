"""The docs' generated blocks about verdicts (docs/protocol.md): every claim on the paper's own numbers, what those
numbers can and cannot settle, every choice a verdict rests on, the worked degrees of freedom, how many
specifications are tried. Registered in report.doc_blocks.BLOCKS, written and checked by `softtokens docs`.

Why a module apart: the verdict's blocks judge the paper's claims (about 20 s with the multiverse, once, cached);
the other blocks count jobs, hosts and datasets."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.lru_cache(maxsize=1)
def _judged_paper() -> tuple:
    """Every claim on the paper's own numbers, with its multiverse and its odds in reproductions (judged once for
    the blocks that show them: the multiverse takes about 20 s)."""
    from softtokens.cells.paper import load_paper_results
    from softtokens.robustness.multiverse import paper_claims
    from softtokens.robustness.reproducibility import paper_reproducibility
    from softtokens.verdict.choices import DEFAULT

    paper = load_paper_results()
    judged = paper_claims(paper, DEFAULT)
    odds = paper_reproducibility(paper)   # the report page's P(same verdict), attached as it attaches it
    for c in judged:
        c.reproducibility = odds[c.key].record() if c.key in odds else None
    return tuple(judged)


def paper_claims_block(root: Path) -> str:
    """Every claim on the paper's own numbers: its margin, the verdict at the default specification,
    the share of specifications that support it, and what would flip it (verdict.claims, report.page)."""
    from softtokens.report.claim_rows import claims_frame, design_text

    judged = list(_judged_paper())
    frame = claims_frame(judged)
    frame.insert(3, "what these numbers could decide", [design_text(c).replace(f"**{c.verdict}**; ", "")
                                                         if c.design else "—" for c in judged])
    frame.insert(1, "the paper's words (line)", [
        "; ".join(f"\"{q['text']}\" ({q['where'].rsplit('line ', 1)[1].rstrip(')')})" for q in c.quotes) for c in judged])
    frame["verdict (the paper's numbers)"] = [f"**{v}**" for v in frame["verdict (the paper's numbers)"]]
    return frame.to_markdown(index=False)


def judging_choices_block(root: Path) -> str:
    """Every choice a verdict depends on (verdict.choices), with the evidence for the paper's ± read as
    a population std: the ARC-Challenge triples each reading admits (cells.paper.admitted_ddof)."""
    from softtokens.cells.paper import admitted_ddof, load_paper_results
    from softtokens.report.claim_rows import choices_frame

    paper = load_paper_results()
    arc = {d: admitted_ddof(paper, "arc", "accuracy", 1165, d) for d in (0, 1)}
    return (choices_frame().to_markdown(index=False) + "\n\nThe paper's ± on ARC-Challenge (1,165 questions, 3 seeds): "
            + ", ".join(f"ddof {d}: {k} of {n} trained cells admit a seed triple" for d, (k, n) in arc.items()) + ".")


def degrees_of_freedom_block(root: Path) -> str:
    """The worked case of Welch-Satterthwaite degrees of freedom, its p-values computed (verdict.uncertainty):
    two 2-seed cells of different runs, seed variances 8/2 and 2/2 (values 60, 64 and 50, 52), no test set."""
    from softtokens.verdict.uncertainty import difference, survival

    cell = {"model": "m", "train_dataset": "d", "variant": "", "benchmark": "b", "setting": "hard_sample",
            "metric": "pass@4", "n": 2, "sampling_var": 0.0, "seeds": (0, 1), "questions": None}
    est = difference({**cell, "train_mode": "soft", "mean": 62.0, "std": 8 ** 0.5, "values": (60.0, 64.0)},
                     {**cell, "train_mode": "hard", "mean": 51.0, "std": 2 ** 0.5, "values": (50.0, 52.0)})
    return (f"- **Degrees of freedom.** Welch–Satterthwaite: each run's seed part has n − 1, the test-set part is\n"
            f"  taken as exact. A difference of two 2-seed cells with no test-set term, seed variances 4 and 1, has\n"
            f"  25/17 = {est.df:.2f} df; its one-sided p-value at 3 standard errors is {survival(3.0, est.df):.3f} by "
            f"Student's t and {survival(3.0, float('inf')):.4f} by the\n  normal. A contrast dominated by its test set "
            f"is judged as by z.")


def specifications_block(root: Path) -> str:
    """How many specifications each source's verdicts are judged under (robustness.multiverse, verdict.choices)."""
    from softtokens.verdict.choices import alternatives
    from softtokens.verdict.specs import size

    return (f"- **What would flip it.** Every claim is judged again under every combination of the choices below\n"
            f"  (a multiverse: {size('paper'):,} specifications on the paper's numbers, {size('ours'):,} on ours; and one\n"
            f"  choice at a time: {len(alternatives('paper'))} and {len(alternatives('ours'))}). Two specifications that "
            f"compute the same numbers\n  for a claim count once.")


def paper_findings_block(root: Path) -> str:
    """What the paper's numbers can and cannot settle, claim by claim, in words computed from the verdicts (the
    multiverse's shares and smallest flips, the margin curve, the paper's own reading, the narrowest interval)."""
    import numpy as np

    from softtokens.cells.paper import load_paper_results
    from softtokens.verdict.choices import DEFAULT, PAPER_READING_NAME
    from softtokens.verdict.claims import paper_index
    from softtokens.robustness.multiverse import flips_text, margin_text, shares_text
    from softtokens.verdict.uncertainty import quantile

    judged = list(_judged_paper())
    lines = []
    robust = [f"`{c.key}`" for c in judged if c.robust and c.verdict == "supported"]
    lines.append(f"- Supported under every combination of the choices: {', '.join(robust) or 'none'}.")
    idx = paper_index(load_paper_results())(DEFAULT)
    crit = float(quantile(1 - DEFAULT.alpha, np.inf))
    halves = []
    for key, cell in idx.items():     # two trained pass@1 cells of one benchmark: the test sets' share alone
        if key[6] == "pass@1" and key[2] != "none" and key[5] == "hard_greedy" and not cell.get("missing"):
            halves.append((key[4], crit * float(np.sqrt(2 * cell["sampling_var"]))))
    by_bench = {b: min(h for bb, h in halves if bb == b) for b in sorted({b for b, _ in halves})}
    lines.append("- The test sets alone (each cell's binomial variance at its benchmark's size, unpaired) leave a "
                 "90% interval of a pass@1 difference of at least " + ", ".join(
                     f"±{h:.2f} points on {b}" for b, h in by_bench.items()) + ".")
    for c in judged:
        if not c.multiverse:
            continue
        m = c.multiverse
        words = [f"**{c.verdict}** ({c.counts()})"]
        if c.design and c.design.get("lean"):
            words.append(c.design["lean"])
        words.append(shares_text(m))
        words.append(f"what would flip it: {flips_text(m)}")
        if m.get("margin_curve"):
            words.append(f"across margins: {margin_text(m)}")
        words.append(f"{PAPER_READING_NAME}: {m['paper_reading']}")
        lines.append(f"- `{c.key}`: " + "; ".join(words) + ".")
    return "\n".join(lines)
