"""How likely a verdict is to reproduce (robustness.reproducibility) and the cheapest grid that settles a
claim (robustness.claim_plan, `softtokens plan --claims`): simulations that recover known answers,
determinism under a seed, a claim without cells named, and the written grid planned by Snakemake."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from softtokens.robustness import reproducibility as R
from softtokens.verdict.choices import DEFAULT
from softtokens.verdict.reproduction import paper_cells

ROOT = Path(__file__).resolve().parents[1]


def paper(rows) -> pd.DataFrame:
    """A paper table of Llama-3B trained on GSM8K, evaluated on GSM8K (1,319 questions)."""
    return pd.DataFrame([{"table": "tab:main", "model": "llama-3b", "train_dataset": "gsm8k", "train_mode": mode,
                          "variant": "", "benchmark": "gsm8k", "setting": setting, "metric": metric, "mean": mean,
                          "std": std, "highlight": "", "paper_variant": ""}
                         for mode, setting, metric, mean, std in rows])


def claim(key, truth):
    (defn, plan), = R.paper_plans(truth, (key,))
    return defn, plan


def test_equal_cells_with_a_wide_margin_are_supported_more_often_as_seeds_grow():
    """Hard, soft and fuzzy greedy pass@1 all 70 with a seed sd of 3 points, an 8-point margin: the
    test set's ~1.8-point error of a difference leaves room (at 30 seeds an interval of +-3.2 around a
    difference of sd 1.9), the seeds' spread decides: with 2 seeds (t with ~2 df) almost never
    supported, with 30 almost always, never contradicted."""
    truth = R.index_cells(paper_cells(paper([(m, "hard_greedy", "pass@1", 70.0, 3.0) for m in ("hard", "soft", "fuzzy")])))
    spec = DEFAULT.with_margins({"pass1_parity": 8.0})
    defn, plan = claim("pass1_parity", truth)
    p = {n: R.simulate(defn, plan, truth, n, 2000, spec=spec) for n in (2, 3, 8, 30)}
    supported = [p[n].p_supported for n in (2, 3, 8, 30)]
    assert supported == sorted(supported) and supported[0] < 0.5 and supported[-1] > 0.95
    assert all(r.p_contradicted < 0.01 for r in p.values())


def test_a_difference_of_three_standard_errors_is_found_as_often_as_the_normal_power_says():
    """Soft's pass@32 3 standard errors above hard's, no seed spread (the test set alone: z): the
    one-sided test at 0.05 finds it with probability Phi(3 - 1.645) = 0.912. Fuzzy far above, so the
    claim's verdict is soft's."""
    v = 70 * 30 / 1319
    se = math.sqrt(2 * v)
    rows = [("hard", "hard_sample", "pass@32", 70.0, 0.0), ("soft", "hard_sample", "pass@32", 70.0 + 3 * se, 0.0),
            ("fuzzy", "hard_sample", "pass@32", 95.0, 0.0)]
    truth = R.index_cells(paper_cells(paper(rows)))
    defn, plan = claim("passk_advantage", truth)
    r = R.simulate(defn, plan, truth, 3, 6000)
    assert r.p_supported == pytest.approx(stats.norm.cdf(3 - stats.norm.ppf(0.95)), abs=0.02)
    assert r.p_contradicted == 0.0


def test_simulations_are_deterministic_under_their_seed():
    truth = R.index_cells(paper_cells(paper([(m, "hard_greedy", "pass@1", 70.0 + i, 2.0)
                                             for i, m in enumerate(("hard", "soft", "fuzzy"))])))
    defn, plan = claim("pass1_parity", truth)
    a, b = (R.simulate(defn, plan, truth, 5, 500, seed=7) for _ in range(2))
    assert a == b
    c = R.simulate(defn, plan, truth, 5, 500, seed=8)
    assert (a.p_supported, a.p_undecided) != (c.p_supported, c.p_undecided) or a.p_undecided in (0.0, 1.0)


def test_a_claim_with_no_cells_is_named_not_silently_zero():
    truth = R.index_cells(paper_cells(paper([(m, "hard_greedy", "pass@1", 70.0, 2.0) for m in ("hard", "soft")])))
    defn, plan = claim("llama8b_math500_recovery", truth)
    r = R.simulate(defn, plan, truth, 3, 100)
    assert r.p_supported is None and "no cell of the paper's grid" in r.note
    defn, plan = claim("entropy_profile", truth)
    assert "figures only" in R.simulate(defn, plan, truth, 3, 100).note


def test_the_papers_claims_reproduce_with_stated_odds():
    """On the paper's own numbers at its 3 seeds: the pass@32 advantage reproduces almost always; the
    lower-NLL claim, supported on the paper's numbers, in about three reproductions of four."""
    from softtokens.cells.paper import load_paper_results

    odds = R.paper_reproducibility(load_paper_results())
    assert odds["passk_advantage"].p_supported > 0.99
    assert 0.6 < odds["ood_nll_lower_than_hard"].p_supported < 0.9
    assert odds["entropy_profile"].p_supported is None
    assert all(abs(r.p_supported + r.p_undecided + r.p_contradicted - 1) < 1e-9
               for r in odds.values() if r.p_supported is not None)


@pytest.mark.slow
def test_plan_claims_writes_a_grid_snakemake_plans(tmp_path, capsys):
    """`softtokens plan --claims passk_advantage,pass1_parity --json`: one object per claim with its
    odds, the seeds that settle it (pass@32: 2; pass@1 parity: none, its test sets' questions limit it),
    its cells and cost; the grid it writes reuses the paper grid and a dry run plans it."""
    from test_workflow import PAPER_ENV, job_counts, snakemake

    from softtokens.cli import main

    out = tmp_path / "claims.yaml"
    main(["plan", "--config", str(ROOT / "config.yaml"), "--claims", "passk_advantage,pass1_parity", "--json",
          "--write", str(out), "--name", "claims-test"])
    plan = json.loads(capsys.readouterr().out)   # one object: how the reproductions were drawn and judged, each claim
    assert plan["question_rho"] == 0.5 and plan["draws"] == 1000 and plan["grid_name"] == "claims-test"
    records = {r["claim"]: r for r in plan["claims"]}
    assert set(records) == {"passk_advantage", "pass1_parity"}
    for r in records.values():
        assert {"claim", "p_supported", "p_undecided", "p_contradicted", "seeds_needed", "cells", "gpu_hours"} <= set(r)
    assert records["passk_advantage"]["seeds_needed"] == 2 and records["passk_advantage"]["p_supported"] > 0.99
    assert records["pass1_parity"]["seeds_needed"] is None and "questions" in records["pass1_parity"]["note"]
    assert len(records["pass1_parity"]["cells"]) == 45 and records["passk_advantage"]["gpu_hours"] > 0
    proc = snakemake("--profile", "slurm", "-n", "--configfile", str(out), "--config", "grid=claims-test",
                     "--quiet", "rules", env=PAPER_ENV)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    counts = job_counts(proc)
    assert counts["train"] == 45 and counts["evaluate"] == 48 * 3 * 2   # hard greedy and hard sample only


@pytest.mark.slow
def test_a_budget_keeps_the_claims_that_fit_best_first(capsys):
    from softtokens.cli import main

    main(["plan", "--config", str(ROOT / "config.yaml"), "--claims", "passk_advantage,pass1_parity",
          "--budget", "400", "--write", "/dev/null"])
    out = capsys.readouterr().out
    assert "within 400.0 GPU-hours, best first: `passk_advantage`; left out: `pass1_parity`" in out
