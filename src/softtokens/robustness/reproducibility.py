"""How likely a claim's verdict is to reproduce, and how many seeds would settle it: reproductions of
the paper's grid simulated with the paper's own numbers as the truth, each judged by the project's
rules (verdict.claims at the default specification).

Why: a verdict on the paper's numbers is one draw. A researcher deciding what to rerun needs to know
whether a faithful reproduction would reach it again (a verdict that reproduces with probability 0.55
is a different fact from one at 0.99), and what it would take to reach a decided one at all.

The model of a reproduction, per training run (its cells share the run's seeds) and cell:
- a seed's value of a cell is its published mean plus the run's seed effect, sd the cell's sample std
  (its ± read by verdict.choices), correlated between two cells of one run by ``Spec.rho``;
- the cell's mean over its seeds takes one more draw of the test-set error (the same questions for
  every seed: binomial at the benchmark's size for a proportion, the NLL's stated spread), drawn once
  per reproduction and benchmark and taken by each of its cells with the correlation the judge reads
  unpaired cells with (``Spec.question_rho``: verdict.choices), so the simulation draws as the judge reads;
- the reproduction reports the mean and sample std over its seeds, means only (judged as the paper's
  numbers are: unpaired, the seeds' spread modelled). A base model is one evaluation: the test set only.
Every draw of every cell is a numpy array, so thousands of reproductions are judged in one pass of a
claim's plan (verdict.judging evaluates plans on arrays).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from softtokens.cells.paper import paper_test_size
from softtokens.verdict.choices import DEFAULT, Spec
from softtokens.verdict.claims import registry
from softtokens.verdict.claims.define import ClaimDef, Context
from softtokens.verdict.judging import claim_code, claim_parts, index_cells, passk_metric
from softtokens.verdict.uncertainty import RUN_KEYS

DRAWS = 1000                                   # simulated reproductions per question asked
SEED_CHOICES = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 30, 50)   # seeds per run tried for "what settles it"
POWER = 0.8                                    # the probability of a decided verdict "settles" asks for
RNG_SEED = 20251                               # the simulations' seed (deterministic pages)


@dataclass
class Reproducibility:
    """A claim's verdict probabilities under simulated reproductions with ``seeds`` seeds per run."""

    claim: str
    seeds: int
    draws: int
    p_supported: float | None
    p_undecided: float | None
    p_contradicted: float | None
    note: str = ""                              # why a claim was not simulated

    def record(self) -> dict:
        return dict(self.__dict__)

    @property
    def p_decided(self) -> float | None:
        return None if self.p_supported is None else self.p_supported + self.p_contradicted


def plan_cells(plan, measurable: bool = False) -> set[tuple]:
    """The cell keys a claim's plan reads (``measurable``: only those of comparisons that can be made)."""
    return {key for part in plan for c in part.comparisons if not (measurable and c.missing) for key, _ in c.terms}


def draw_cells(truth: dict, keys: set[tuple], seeds: int, draws: int, rng: np.random.Generator,
               spec: Spec = DEFAULT) -> dict:
    """Simulated reproductions of the cells ``keys`` of ``truth`` (an index of the paper's cells):
    each cell a dict like a reproduction's cell, its ``mean``, ``std`` and ``sampling_var`` arrays of
    ``draws`` (module docstring)."""
    runs: dict[tuple, list[tuple]] = {}
    for key in sorted(keys):
        runs.setdefault(key[:4], []).append(key)
    drawn = {}
    rho = spec.simulated_rho
    q_rho = min(max(spec.question_rho, 0.0), 1.0)
    questions = {bench: rng.standard_normal(draws) for bench in sorted({(k[4], k[6]) for k in keys})}
    for run, members in runs.items():
        shared = rng.standard_normal((draws, seeds))
        for key in members:
            cell = truth[key]
            base = cell["train_mode"] == "none"
            truth_mean, sd = float(cell["mean"]), 0.0 if base else float(cell["std"])
            n = 1 if base else seeds
            z = math.sqrt(rho) * shared[:, :n] + math.sqrt(1 - rho) * rng.standard_normal((draws, n))
            values = truth_mean + sd * z
            test_sd = math.sqrt(max(float(cell["sampling_var"]), 0.0))
            test_z = math.sqrt(q_rho) * questions[(key[4], key[6])] + math.sqrt(1 - q_rho) * rng.standard_normal(draws)
            mean = values.mean(axis=1) + test_sd * test_z
            if cell["metric"] != "nll_correct":
                mean = np.clip(mean, 0.0, 100.0)
            std = values.std(axis=1, ddof=1) if n > 1 else np.zeros(draws)
            sampling = _sampling_var(cell, mean, spec)
            drawn[key] = {**{k: cell[k] for k in (*RUN_KEYS, "benchmark", "setting", "metric")},
                          "mean": mean, "std": std, "n": n, "sampling_var": sampling,
                          "se": np.sqrt(std ** 2 / n + sampling), "values": None, "seeds": None, "questions": None}
    return drawn


def _sampling_var(cell: dict, mean: np.ndarray, spec: Spec) -> np.ndarray:
    """A cell's test-set variance at each drawn mean, as the judge would estimate it from the
    reproduction's mean (reproduction.paper_sampling_var, on arrays)."""
    size = paper_test_size(cell["benchmark"])
    if size is None:
        return np.full_like(mean, float(cell["sampling_var"]))
    if cell["metric"] == "nll_correct":
        return (spec.nll_row_cv * mean) ** 2 / size
    return mean * (100.0 - mean) / size


def simulate(defn: ClaimDef, plan, truth: dict, seeds: int, draws: int = DRAWS, seed: int = RNG_SEED,
             spec: Spec = DEFAULT) -> Reproducibility:
    """The probability of each verdict of ``defn`` (planned as ``plan`` on ``truth``) over ``draws``
    simulated reproductions with ``seeds`` seeds per run."""
    if plan is None:
        return Reproducibility(defn.key, seeds, 0, None, None, None,
                               "not simulated: the paper gives this as figures only, no cell to draw from")
    keys = plan_cells(plan, measurable=True)
    if not keys:
        return Reproducibility(defn.key, seeds, 0, None, None, None,
                               "not simulated: no cell of the paper's grid is one this claim reads")
    rng = np.random.default_rng([seed, seeds])
    drawn = draw_cells(truth, keys, seeds, draws, rng, spec)
    code = claim_code(claim_parts(plan, drawn, spec, spec.margin(defn.key, defn.margin)))
    if code is None:
        return Reproducibility(defn.key, seeds, draws, None, None, None, "not simulated: nothing to compare")
    code = np.broadcast_to(np.asarray(code), (draws,))
    share = {v: float(np.mean(code == v)) for v in (1, 0, -1)}
    return Reproducibility(defn.key, seeds, draws, share[1], share[0], share[-1])


def seeds_to_settle(defn: ClaimDef, plan, truth: dict, power: float = POWER, draws: int = DRAWS,
                    seed: int = RNG_SEED, spec: Spec = DEFAULT) -> tuple[int | None, list[Reproducibility]]:
    """The fewest seeds per run (of SEED_CHOICES) at which a reproduction reaches a decided verdict
    with probability ``power``, and each number tried (None: none of them does)."""
    tried = []
    for n in SEED_CHOICES:
        r = simulate(defn, plan, truth, n, draws, seed, spec)
        tried.append(r)
        if r.p_decided is None:
            return None, tried
        if r.p_decided >= power:
            return n, tried
    return None, tried


def paper_truth(paper: pd.DataFrame, spec: Spec = DEFAULT) -> dict:
    """The paper's cells as the truth of the simulations: its means, the sample stds its ± implies."""
    from softtokens.verdict.reproduction import paper_cells

    return index_cells(paper_cells(paper, spec))


def paper_plans(truth: dict, keys: tuple[str, ...] | None = None) -> list[tuple[ClaimDef, list | None]]:
    """Each claim's plan on the paper's cells (the entropy claim: none, figures only)."""
    ctx = Context(passk_metric(truth), None)
    return [(d, d.plan(truth, ctx)) for d in registry() if keys is None or d.key in keys]


def paper_reproducibility(paper: pd.DataFrame, seeds: int = 3, draws: int = DRAWS, spec: Spec = DEFAULT
                          ) -> dict[str, Reproducibility]:
    """Every claim's verdict probabilities over reproductions of the paper's grid at its seeds."""
    truth = paper_truth(paper, spec)
    return {d.key: simulate(d, plan, truth, seeds, draws, RNG_SEED, spec) for d, plan in paper_plans(truth)}
