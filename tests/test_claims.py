"""The paper's claims: each rule on cells whose verdicts are computed by hand, the quantifiers'
shares, comparisons of identical cells left out, and every claim on the paper's own numbers."""

import math
from pathlib import Path

import pandas as pd
import pytest

from softtokens.report import claims, judging
from softtokens.report.judging import Check, share_holds
from softtokens.report.paper import load_paper_results
from softtokens.report.reproduction import paper_cells

TEX = Path(__file__).resolve().parents[2] / "shared" / "paper" / "soft-tokens-hard-truths.tex"


def cell(model, ds, mode, bench, setting, metric, mean, se, values=None, std=0.0, n=3):
    return {"model": model, "train_dataset": ds, "train_mode": mode, "variant": "", "benchmark": bench,
            "setting": setting, "metric": metric, "mean": mean, "std": std, "n": n, "se": se, "values": values}


def frame(*rows) -> pd.DataFrame:
    return pd.DataFrame(rows)


def test_quantifiers():
    half = [Check(True, ""), Check(False, "")]
    assert share_holds(half, "most") is False            # more than half
    assert share_holds(half + [Check(True, "")], "generally") is True   # 2/3 is enough
    assert share_holds([Check(True, "")] * 5 + [Check(False, "")] * 3, "generally") is False  # 5/8 < 2/3
    assert share_holds([Check(True, ""), Check(None, "")], "every") is True  # not informative: not counted
    assert share_holds([Check(None, "")], "every") is None


def test_pass1_parity_by_hand():
    """se 1 each: tolerance 2 sqrt(2) = 2.83. soft 72 vs 70: similar; fuzzy 74 vs 70: not (4 > 2.83);
    on b2 soft 61 vs 60 similar: 2 of 3, 'generally' holds."""
    rows = [cell("m", "d", "hard", "b1", "hard_greedy", "pass@1", 70, 1.0),
            cell("m", "d", "soft", "b1", "hard_greedy", "pass@1", 72, 1.0),
            cell("m", "d", "fuzzy", "b1", "hard_greedy", "pass@1", 74, 1.0),
            cell("m", "d", "hard", "b2", "hard_greedy", "pass@1", 60, 1.0),
            cell("m", "d", "soft", "b2", "hard_greedy", "pass@1", 61, 1.0)]
    c = claims.claim_pass1_parity(frame(*rows))
    assert (c.held, c.total, c.verdict) == (2, 3, judging.SUPPORTED)
    rows[-1] = cell("m", "d", "soft", "b2", "hard_greedy", "pass@1", 64, 1.0)  # 4 > 2.83: 1 of 3
    c = claims.claim_pass1_parity(frame(*rows))
    assert (c.held, c.total, c.verdict) == (1, 3, judging.NOT_SUPPORTED)


def test_passk_advantage_is_an_average_beyond_its_standard_error():
    """soft - hard = 5, 3, -1 (se 1 each side): mean 2.33, se of the mean sqrt(3 * 2) / 3 = 0.816,
    2 se = 1.63: holds. fuzzy - hard = 1, 1, 1: mean 1 < 1.63: fails."""
    rows = []
    for bench, hard, soft in (("b1", 80, 85), ("b2", 70, 73), ("b3", 60, 59)):
        rows += [cell("m", "d", "hard", bench, "hard_sample", "pass@8", hard, 1.0),
                 cell("m", "d", "soft", bench, "hard_sample", "pass@8", soft, 1.0),
                 cell("m", "d", "fuzzy", bench, "hard_sample", "pass@8", hard + 1, 1.0)]
    c = claims.claim_passk_advantage(frame(*rows))
    assert "pass@8" in c.statement and "pass@8" in c.rule  # the k the grid has, said
    assert (c.held, c.total, c.verdict) == (1, 2, judging.NOT_SUPPORTED)
    soft_line = next(e for e in c.evidence if e.startswith("holds: soft"))
    assert "+2.33" in soft_line and f"{2 * math.sqrt(6) / 3:.2f}" in soft_line


def test_identical_cells_are_not_informative():
    """On the toy hard greedy and fuzzy greedy of a model take the same tokens: that comparison is
    listed, not counted; with nothing else left the claim is not yet measured."""
    same = (50.0, 52.0)
    rows = [cell("m", "d", mode, "b", s, "pass@1", 51.0, 1.0, values=same)
            for mode in ("hard", "soft", "fuzzy") for s in ("hard_greedy", "fuzzy_greedy")]
    c = claims.claim_hard_inference_best(frame(*rows))
    assert c.total == 0 and c.not_informative == 3 and c.verdict == judging.NOT_MEASURED
    assert all(e.startswith("not informative") for e in c.evidence)


def test_hard_inference_best_needs_both_metrics():
    rows = []
    for mode in ("hard", "soft", "fuzzy"):
        rows += [cell("m", "d", mode, "b", "hard_greedy", "pass@1", 60, 1.0),
                 cell("m", "d", mode, "b", "soft_greedy", "pass@1", 58, 1.0),
                 cell("m", "d", mode, "b", "hard_sample", "pass@4", 80, 1.0),
                 cell("m", "d", mode, "b", "soft_sample", "pass@4", 90, 1.0)]  # soft inference 10 above: fails
    c = claims.claim_hard_inference_best(frame(*rows))
    assert (c.held, c.total, c.verdict) == (3, 6, judging.NOT_SUPPORTED)


def test_ood_nll_preserved_by_hand():
    """hard - base = +0.3 on two benchmarks (se 0.01: 2 se of the mean 0.014): degrades; soft +0.005:
    preserved; fuzzy +0.1: not preserved -> not supported."""
    rows = []
    for bench in ("arc", "mmlu"):
        rows += [cell("m", "none", "none", bench, "loglik", "nll_correct", 2.0, 0.01, n=1),
                 cell("m", "d", "hard", bench, "loglik", "nll_correct", 2.3, 0.01),
                 cell("m", "d", "soft", bench, "loglik", "nll_correct", 2.005, 0.01),
                 cell("m", "d", "fuzzy", bench, "loglik", "nll_correct", 2.1, 0.01)]
    c = claims.claim_ood_nll_preserved(frame(*rows))
    assert (c.held, c.total, c.verdict) == (2, 3, judging.NOT_SUPPORTED)
    assert any(e.startswith("fails: fuzzy preserves") for e in c.evidence)
    lower = claims.claim_ood_nll_lower_than_hard(frame(*rows))
    assert (lower.held, lower.total, lower.verdict) == (2, 2, judging.SUPPORTED)


def test_entropy_claim_by_hand():
    """Base hard greedy 0.4, hard sample 2.0; soft-trained 0.5 / 1.8 (within 1.5x); hard-trained hard
    sample 0.6 (below 2.0 / 1.5 and nearer 0.4 than 2.0 in ratio): supported."""
    rows = [("none", "none", "hard_greedy", 0.4), ("none", "none", "hard_sample", 2.0),
            ("d", "soft", "hard_greedy", 0.5), ("d", "soft", "hard_sample", 1.8),
            ("d", "hard", "hard_greedy", 0.3), ("d", "hard", "hard_sample", 0.6)]
    entropy = pd.DataFrame([{"model": "m", "train_dataset": ds, "train_mode": mode, "variant": "", "benchmark": "b",
                             "setting": s, "seed": 0, "entropy": h} for ds, mode, s, h in rows])
    c = claims.claim_entropy_profile(pd.DataFrame(), entropy)
    assert (c.held, c.total, c.verdict) == (3, 3, judging.SUPPORTED)
    entropy.loc[entropy.train_mode.eq("soft") & entropy.setting.eq("hard_sample"), "entropy"] = 1.2  # 1.67x lower
    c = claims.claim_entropy_profile(pd.DataFrame(), entropy)
    assert (c.held, c.total, c.verdict) == (2, 3, judging.NOT_SUPPORTED)
    assert claims.claim_entropy_profile(pd.DataFrame(), None).verdict == judging.NOT_JUDGED


def test_every_claim_on_the_papers_own_numbers():
    """Every claim the paper's tables can judge is supported on them, but one: its 'soft training
    preserves the out-of-domain NLL on average' fails, because Qwen-3B soft training on MATH raises
    ARC's NLL by 0.82 and MMLU's by 0.14 (docs/protocol.md). The entropy claim needs figures."""
    judged = {c.key: c for c in claims.judge_claims(paper_cells(load_paper_results()))}
    assert len(judged) >= 7
    expected_fail = {"ood_nll_preserved"}
    for key, c in judged.items():
        if key == "entropy_profile":
            assert c.verdict == judging.NOT_JUDGED
        elif key in expected_fail:
            assert c.verdict == judging.NOT_SUPPORTED
            assert [e for e in c.evidence if e.startswith("fails")] == [
                next(e for e in c.evidence if e.startswith("fails: soft preserves"))]
        else:
            assert c.verdict == judging.SUPPORTED, (key, c.summary(), [e for e in c.evidence if e.startswith("fails")])
    assert (judged["pass1_parity"].held, judged["pass1_parity"].total) == (22, 30)  # 'most' / 'generally'


def test_quotes_are_the_papers_words():
    every = claims.judge_claims(pd.DataFrame(columns=["model", "train_dataset", "train_mode", "variant", "benchmark",
                                                      "setting", "metric", "mean", "std", "n", "se", "values"]))
    assert all(c.quotes and all("line" in q["where"] for q in c.quotes) for c in every)
    if not TEX.is_file():
        pytest.skip("the paper's LaTeX source is not beside this checkout")
    import re

    tex = re.sub(r"\\emph\{|\\textbf\{|[{}$]|\\%", "", TEX.read_text())
    tex = re.sub(r"\s+", " ", tex)
    lines = TEX.read_text().splitlines()
    for c in every:
        for q in c.quotes:
            assert re.sub(r"\s+", " ", q["text"]).replace("%", "") in tex.replace("%", ""), (c.key, q["text"])
            line = int(q["where"].rsplit("line ", 1)[1].rstrip(")"))
            first_words = " ".join(q["text"].split()[:3]).replace("%", "")
            window = re.sub(r"\\emph\{|[{}$]|\s+", " ", " ".join(lines[line - 3: line + 2]))
            assert re.sub(r"\s+", " ", first_words) in re.sub(r"\s+", " ", window), (c.key, line)
