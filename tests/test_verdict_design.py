"""No verdict bought by missing data, a contradiction held at its level, and a design that says what
it could decide: the four checks of 'No verdict bought by missing data' (docs/protocol.md).

- blanking the spread of a claim's unestablished comparisons (one seed, a blank ±) never makes a
  verdict "supported", on the paper's numbers and on our numbers;
- a family of comparisons whose true differences sit exactly at the margin is "contradicted" at no
  more than alpha, family-wise, over thousands of seeded tables;
- the planner (`plan --claims --json`) and the judge read unpaired cells with one correlation, and the
  planner's P(contradicted) matches a simulation written here that draws the way the judge reads;
- the report's first screen names each claim's verdict, whether it could have gone another way on its
  design, and which way an undecided one leans."""

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from softtokens.cells.lookup import index_cells
from softtokens.cells.paper import load_paper_results
from softtokens.robustness import reproducibility
from softtokens.verdict import claims, judging
from softtokens.verdict.choices import DEFAULT, EVERY, GENERALLY, MOST
from softtokens.verdict.judging import SAME, Comparison, PartPlan
from softtokens.verdict.reproduction import paper_cells

ROOT = Path(__file__).resolve().parents[1]


def _unestablished_cells(c, idx: dict) -> set[tuple]:
    """The cells of a claim's comparisons that are not established (its evidence lines say which)."""
    out = set()
    for d, parts in claims.plans_for(idx, None, (c.key,)):
        for part in parts or []:
            for comp in part.comparisons:
                line = next((e for e in c.evidence if comp.label in e), "")
                if not line.startswith("supported"):
                    out |= {key for key, _ in comp.terms}
    return out


def _blanked(idx: dict, keys: set[tuple]) -> dict:
    return {k: ({**v, "std": float("nan"), "se": float("nan")} if k in keys else v) for k, v in idx.items()}


def _no_blanking_supports(idx: dict, source: str):
    judged = claims.judge_set(lambda _: idx, source, sensitivity=False)
    for c in judged:
        if c.verdict in (judging.SUPPORTED, judging.NOT_JUDGED, judging.NOT_MEASURED):
            continue
        cells = _unestablished_cells(c, idx)
        assert cells, c.key
        blanked = claims.judge_set(lambda _: _blanked(idx, cells), source, sensitivity=False, keys=(c.key,))[0]
        assert blanked.verdict != judging.SUPPORTED, (c.key, c.verdict, blanked.summary())
        if blanked.verdict == judging.UNDECIDED:
            assert "no spread" in blanked.summary(), blanked.summary()
        # one unestablished comparison's cells at a time, too
        for key in sorted(cells)[:6]:
            one = claims.judge_set(lambda _: _blanked(idx, {key}), source, sensitivity=False, keys=(c.key,))[0]
            assert one.verdict != judging.SUPPORTED, (c.key, key, one.summary())


def test_blanking_a_spread_never_buys_a_supported_verdict_on_the_papers_numbers():
    idx = index_cells(paper_cells(load_paper_results()))
    _no_blanking_supports(idx, "paper")


def test_the_issues_example_no_longer_turns_supported():
    """Blanking the spread of the 10 cells behind ood_accuracy_comparable's 10 unestablished comparisons
    once turned 'undecided, 20 of 30' into 'supported, 20 of 20'; now the 10 count as undecided, named."""
    idx = index_cells(paper_cells(load_paper_results()))
    c = claims.judge_set(lambda _: idx, "paper", sensitivity=False, keys=("ood_accuracy_comparable",))[0]
    assert c.verdict == judging.UNDECIDED
    cells = _unestablished_cells(c, idx)
    soft_or_fuzzy = {k for k in cells if k[2] != "hard"}
    blanked = claims.judge_set(lambda _: _blanked(idx, soft_or_fuzzy), "paper", sensitivity=False,
                               keys=("ood_accuracy_comparable",))[0]
    assert blanked.verdict == judging.UNDECIDED
    assert f"{len(soft_or_fuzzy)} of 30 comparisons cannot be made (no spread" in blanked.summary()


def test_blanking_a_spread_never_buys_a_supported_verdict_on_our_numbers(tmp_path):
    """Our cells: two seeds per run on two benchmarks (paired, per-question rows), each spread blanked as a
    one-seed run leaves it."""
    rows = []
    rng = np.random.default_rng(7)
    questions = pd.Index([str(i) for i in range(400)], name="id")
    for mode in ("hard", "soft", "fuzzy"):
        for bench in ("b1", "b2"):
            for setting in ("hard_greedy", "hard_sample", "soft_greedy", "soft_sample", "fuzzy_greedy",
                            "fuzzy_sample"):
                for metric in ("pass@1",) + (("pass@8",) if setting.endswith("sample") else ()):
                    q = pd.Series(100.0 * (rng.random(400) < 0.6), index=questions)
                    values = (float(q.mean()) + rng.normal(0, 1.0), float(q.mean()) + rng.normal(0, 1.0))
                    mean, std = float(np.mean(values)), float(np.std(values, ddof=1))
                    rows.append({"model": "m", "train_dataset": "d", "train_mode": mode, "variant": "",
                                 "benchmark": bench, "setting": setting, "metric": metric, "mean": mean, "std": std,
                                 "n": 2, "sampling_var": float(q.var(ddof=0)) / 400,
                                 "se": math.sqrt(std ** 2 / 2 + float(q.var(ddof=0)) / 400), "values": values,
                                 "seeds": (0, 1), "questions": q, "failed_seeds": ()})
    _no_blanking_supports(index_cells(pd.DataFrame(rows)), "ours")


# ---------------------------------------------------------------- contradiction held at its level
def _null_family(k: int, se: float, quantifiers: tuple[str, ...], draws: int, seed: int) -> float:
    """P(claim contradicted) over ``draws`` tables of k sameness comparisons whose true differences are
    exactly +-margin (signs alternating), each difference's error ``se`` (unpaired test sets, no seeds)."""
    margin = DEFAULT.margin("pass1_parity", "points")
    rng = np.random.default_rng(seed)
    idx, comps = {}, []
    for i in range(k):
        a, b = (("m", f"d{i}", mode, "", "b", "hard_greedy", "pass@1") for mode in ("soft", "hard"))
        truth = margin if i % 2 == 0 else -margin
        half = se * se / 2
        idx[a] = {"model": "m", "train_dataset": f"d{i}", "train_mode": "soft", "variant": "", "benchmark": "b",
                  "setting": "hard_greedy", "metric": "pass@1", "mean": 50 + truth + math.sqrt(half) * rng.standard_normal(draws),
                  "std": 0.0, "n": 3, "sampling_var": half, "se": math.sqrt(half), "values": None, "seeds": None,
                  "questions": None}
        idx[b] = {**idx[a], "train_mode": "hard", "mean": 50 + math.sqrt(half) * rng.standard_normal(draws)}
        comps.append(Comparison(f"comparison {i}", ((a, 1.0), (b, -1.0)), SAME))
    plan = [PartPlan(q, q, tuple(comps)) for q in quantifiers]
    code = judging.claim_code(judging.claim_parts(plan, idx, replace(DEFAULT, dist="z"), margin))
    return float(np.mean(np.broadcast_to(code, (draws,)) == -1))


@pytest.mark.parametrize("se_over_margin", [0.2, 1.0, 10.0])
@pytest.mark.parametrize("quantifiers", [(EVERY,), (MOST, GENERALLY), (EVERY, MOST, GENERALLY, EVERY)])
def test_a_null_family_at_the_margin_is_contradicted_at_no_more_than_alpha(se_over_margin, quantifiers):
    """True differences exactly at the margin, 2,500 seeded tables each: the claim is contradicted in at
    most alpha of them (plus three Monte-Carlo standard errors), for one part or four, with the error at
    a fifth of the margin or ten times it (where the smaller of two one-sided p-values reached 2 alpha)."""
    draws = 2500
    rate = _null_family(12, se_over_margin * 2.5, quantifiers, draws, seed=int(se_over_margin * 10) + len(quantifiers))
    alpha = DEFAULT.alpha
    assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / draws), rate


def test_one_comparison_at_the_margin_with_a_huge_error_is_held_at_alpha():
    """The case the old test failed: one sameness comparison, the error 10x the margin, the truth at
    +margin: the smaller of two one-sided p-values contradicted it in about 2 alpha of draws."""
    rate = _null_family(1, 25.0, (EVERY,), 20000, seed=3)
    assert rate <= DEFAULT.alpha + 3 * math.sqrt(0.05 * 0.95 / 20000)
    assert rate > 0.02   # the test still has its power on the far tail: not held at 0 by over-correction


# ---------------------------------------------------------------- the planner and the judge
def _direct_p_contradicted(paper: pd.DataFrame, seeds: int, draws: int, rho_q: float, seed: int) -> float:
    """pass1_parity over reproductions drawn here, independently of robustness.reproducibility: per run a seed
    effect (the paper's sample std, cells of one run correlated by Spec.rho), per benchmark one test-set
    draw per reproduction taken by each cell with correlation rho_q; judged with the same rho_q."""
    spec = replace(DEFAULT, question_rho=rho_q)
    truth = index_cells(paper_cells(paper, spec))
    (defn, plan), = reproducibility.paper_plans(truth, ("pass1_parity",))
    keys = sorted(reproducibility.plan_cells(plan, measurable=True))
    rng = np.random.default_rng(seed)
    questions = {}
    runs = {}
    drawn = {}
    for key in keys:
        c = truth[key]
        run = runs.setdefault(key[:4], rng.standard_normal((draws, seeds)))
        z = math.sqrt(spec.simulated_rho) * run + math.sqrt(1 - spec.simulated_rho) * rng.standard_normal((draws, seeds))
        values = c["mean"] + c["std"] * z
        q = questions.setdefault(key[4], rng.standard_normal(draws))
        test_z = math.sqrt(rho_q) * q + math.sqrt(1 - rho_q) * rng.standard_normal(draws)
        mean = np.clip(values.mean(axis=1) + math.sqrt(c["sampling_var"]) * test_z, 0, 100)
        std = values.std(axis=1, ddof=1)
        sampling = mean * (100 - mean) / (c["sampling_var"] and (c["mean"] * (100 - c["mean"]) / c["sampling_var"]))
        drawn[key] = {**{k: c[k] for k in ("model", "train_dataset", "train_mode", "variant", "benchmark",
                                           "setting", "metric")},
                      "mean": mean, "std": std, "n": seeds, "sampling_var": sampling,
                      "se": np.sqrt(std ** 2 / seeds + sampling), "values": None, "seeds": None, "questions": None}
    code = judging.claim_code(judging.claim_parts(plan, drawn, spec, spec.margin(defn.key, defn.margin)))
    return float(np.mean(np.broadcast_to(code, (draws,)) == -1))


def test_the_planner_draws_the_way_the_judge_reads(capsys):
    from softtokens.cli import main

    main(["plan", "--config", str(ROOT / "config.yaml"), "--claims", "pass1_parity", "--json"])
    plan = json.loads(capsys.readouterr().out)
    rho = plan["question_rho"]
    assert rho == DEFAULT.reproduction_question_rho   # one named choice for the planner and its judge
    record = plan["claims"][0]
    assert not list((ROOT / "grids").glob("claims-*.yaml"))   # --json alone writes no grid
    direct = _direct_p_contradicted(load_paper_results(), 3, 4000, rho, seed=11)
    assert abs(record["p_contradicted"] - direct) <= 0.03, (record["p_contradicted"], direct)


# ---------------------------------------------------------------- the first screen
@pytest.mark.slow
def test_the_first_screen_says_what_each_design_could_decide(tmp_path):
    from softtokens.report.page import write_report

    evals = []
    settings = {"grid": "paper", "toy": False, "gpus": {}}
    out = tmp_path / "report"
    write_report(evals, tmp_path / "benchmarks", out, settings)
    page = (out / "reproduction.md").read_text()
    # the glance table with the design's words: the answer in detail, right below the first screen
    lines = page.split("## The answer, in detail")[1].splitlines()[:40]
    screen = "\n".join(lines)
    judged = json.loads((out / "claims.json").read_text())["paper"]
    for c in judged:
        assert f"`{c['key']}`" in screen, c["key"]
        if c["verdict"] == judging.NOT_JUDGED:
            continue
        row = next(line for line in lines if f"`{c['key']}`" in line and line.startswith("|"))
        assert f"**{c['verdict']}**" in row
        if not c["design"]["can_support"]:
            assert "cannot be supported on these numbers" in row
        if c["verdict"] == judging.UNDECIDED:
            assert "leans toward the claim" in row or "leans against the claim" in row
    parity = next(line for line in lines if line.startswith("| `pass1_parity`"))
    # 'competitive' read one-sided (issue 72): 8 of 30 estimates with hard training ahead by more than 2.5, so 22 at
    # or above -2.5 (read two-sided, 16 were outside ±2.5, the 8 with soft or fuzzy ahead counted against it)
    assert "leans toward the claim: 22 of 30 point estimates at or above -2.5" in parity, parity


@pytest.mark.parametrize("rule", [SAME, judging.NOT_WORSE, judging.MORE, judging.LESS])
def test_the_seeds_that_would_decide_a_comparison_are_found_as_one_count_at_a_time_finds_them(rule):
    """claims.judge.seeds_to_decide tries every count at once (the report's job was mostly that loop): the count it
    names is the first at which the count-at-a-time test decides, for estimates decided early, late and never."""
    from types import SimpleNamespace

    from softtokens.verdict.claims.judge import MAX_SEEDS, seeds_to_decide
    from softtokens.verdict.uncertainty import Estimate, satterthwaite

    def one_at_a_time(est, margin):
        for n in range(est.seeds + 1, MAX_SEEDS + 1):
            p_sup, p_con = judging.test(est.rescaled(n), rule, margin)
            if p_sup <= DEFAULT.alpha or p_con <= DEFAULT.alpha:
                return n
        return None

    found = set()
    rng = np.random.default_rng(0)
    for _ in range(300):
        seeds = int(rng.integers(2, 6))
        seeds_var, test_var = rng.uniform(0, 4e-3), rng.choice([0.0, rng.uniform(0, 1e-3)])
        seed_df = float(seeds - 1)
        est = Estimate(float(rng.normal(0, 0.04)), math.sqrt(seeds_var + test_var),
                       satterthwaite(seeds_var, seed_df, test_var), "paired", seeds_var, test_var, seed_df, seeds)
        want = one_at_a_time(est, 0.02)
        comparison = SimpleNamespace(est=est, comparison=SimpleNamespace(rule=rule))
        assert seeds_to_decide(comparison, 0.02, DEFAULT) == want
        found.add("never" if want is None else "next" if want == seeds + 1 else "later")
    assert found == {"never", "next", "later"}, found
