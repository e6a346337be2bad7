"""Which value a hyperparameter search selects, and whether the selection is a finding or noise.

The paper selected its learning rates and noise factor "using greedy validation performance" (Appendix D) and
reports one value per model. Here each run's number is its selected checkpoint's greedy validation pass@1 (the
best validated step), averaged over its seeds; the value with the highest mean is selected, per (model, train
set) and per model (its train sets combined, each weighted equally: the paper's one value per model).

A selection is a finding only when no other value is within noise of it, read with three stated choices:
- **paired**: every value is scored on the same validation questions, so the difference of two values is taken
  question by question (each question's outcome averaged over the seeds both values ran), and its standard error
  is that of those paired differences; where a run recorded no per-question outcomes, the unpaired error (seeds'
  spread, or with one seed the validation set's binomial error, said so);
- **family-wise**: the winner is compared with K - 1 others, so two values are within noise when their difference
  is under z standard errors with z Bonferroni-corrected over the K - 1 comparisons at two-sided 5 % (2.8 for 10
  values), not 1.96 per comparison;
- **the winner's optimism** is stated, not hidden: the maximum of K noisy scores is biased upward; were the K
  values equally good, the winner's score would exceed the truth by about its standard error x E[max of K standard
  normals] (1.54 for 10 values), reported beside the selection."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from softtokens.cells.spread import proportion_var
from softtokens.config.sweeps import SWEPT, variant_name

ALPHA = 0.05   # family-wise, two-sided, over a search's comparisons with its winner (a stated choice)
COMBINED = "all train sets"   # the dataset slot of a per-model selection


def value_text(param: str, value: float) -> str:
    """6e-06, 1.4e-04, 0.33: as the sweep's variant names write it."""
    return variant_name(param, value).removeprefix(SWEPT[param][1])


def family_z(k: int) -> float:
    """The two-sided z of ALPHA Bonferroni-corrected over the K - 1 comparisons with the winner."""
    from scipy.stats import norm

    return float(norm.ppf(1 - ALPHA / (2 * max(1, k - 1))))


@lru_cache(maxsize=None)
def expected_max(k: int) -> float:
    """E[max of K independent standard normals]: the winner's optimism in standard errors when all are equal."""
    if k <= 1:
        return 0.0
    from scipy.integrate import quad
    from scipy.stats import norm

    return float(quad(lambda x: x * k * norm.pdf(x) * norm.cdf(x) ** (k - 1), -12, 12)[0])


def value_stats(accuracies: list[float], n_validation: int) -> tuple[float, float, str]:
    """(mean, standard error, where the error comes from) of one value's runs, unpaired."""
    k = len(accuracies)
    mean = statistics.fmean(accuracies)
    if k >= 2:
        return mean, statistics.stdev(accuracies) / math.sqrt(k), "seeds"
    # one seed: the validation set's binomial error of one run (cells.spread's proportion variance, in %;
    # add-one smoothed, so a 0 or 1 has one too)
    p = (mean * n_validation + 1) / (n_validation + 2)
    return (mean, math.sqrt(proportion_var(100 * p, n_validation)) / 100,
            "validation set only (one seed: seed-to-seed spread unmeasured)")


def _per_question(outcomes: list[str]) -> list[float] | None:
    """Each question's outcome averaged over seeds (None where a seed recorded none, or lengths differ)."""
    if not outcomes or any(not o for o in outcomes) or len({len(o) for o in outcomes}) != 1:
        return None
    return [statistics.fmean(int(o[i]) for o in outcomes) for i in range(len(outcomes[0]))]


@dataclass
class Search:
    """One search's runs: per swept value its seeds' accuracies and per-question outcomes ("" where not recorded)."""
    accuracies: dict[float, list[float]]
    outcomes: dict[float, list[str]]
    n_validation: int

    def mean(self, v: float) -> float:
        return statistics.fmean(self.accuracies[v])

    def diff_se(self, a: float, b: float) -> tuple[float, str]:
        """The standard error of mean(a) - mean(b): paired on the questions where both recorded them."""
        qa, qb = _per_question(self.outcomes.get(a, [])), _per_question(self.outcomes.get(b, []))
        if qa is not None and qb is not None and len(qa) == len(qb) >= 2:
            d = [x - y for x, y in zip(qa, qb)]
            return statistics.stdev(d) / math.sqrt(len(d)), f"paired on the same {len(d)} validation questions"
        sa, sb = value_stats(self.accuracies[a], self.n_validation), value_stats(self.accuracies[b], self.n_validation)
        return math.sqrt(sa[1] ** 2 + sb[1] ** 2), f"unpaired ({sa[2]})"


@dataclass
class Selection:
    """One search: a (model, train set or COMBINED, swept parameter, training mode) and what it selected."""
    model: str
    dataset: str
    param: str
    mode: str
    values: list[dict]                       # per swept value: value, mean, se, seeds' accuracies
    selected: float
    tied: list[float]                        # the values within noise of the selected one (it included)
    reference: float | None                  # what the paper selected (or the grid's own value, below)
    reference_source: str                    # "paper" or "configured" (a model the paper did not train)
    noise: str = ""
    missing: list[float] = field(default_factory=list)   # swept values with no run selected yet
    z: float = 1.96                          # the family-wise threshold the ties were read with
    optimism: float = 0.0                    # the winner's expected upward bias were all values equal (accuracy)

    @property
    def finding(self) -> bool:
        return len(self.tied) == 1 and not self.missing

    def statement(self) -> str:
        sel, ref = value_text(self.param, self.selected), self.reference
        said = f"selected {sel}"
        if ref is not None:
            ref_text = value_text(self.param, ref)
            swept = any(math.isclose(v["value"], ref) for v in self.values)
            same = math.isclose(self.selected, ref)
            within = any(math.isclose(t, ref) for t in self.tied)
            said += f" ({self.reference_source}: {ref_text}"
            if not same:
                said += (", within noise of it" if within else ", outside the noise of it" if swept
                         else ", not among the values swept")
            said += ")"
        if len(self.tied) > 1:
            others = ", ".join(value_text(self.param, t) for t in self.tied if not math.isclose(t, self.selected))
            said += f"; {others} within noise of it: the selection is not a finding"
        if self.missing:
            said += f"; not yet run: {', '.join(value_text(self.param, m) for m in self.missing)}"
        return said

    def record(self) -> dict:
        return {**asdict(self), "finding": self.finding, "statement": self.statement()}


def _selection(model, dataset, param, mode, values: list[float], mean, diff_se, reference, reference_source, noise_se,
               missing) -> Selection:
    """The winner of ``values`` by ``mean(v)``, its ties by ``diff_se(a, b) -> (se, how)`` at the family-wise z."""
    z = family_z(len(values))
    best = max(values, key=lambda v: (mean(v), -v))   # equal means: the smallest value
    others = {v: diff_se(best, v) for v in values if v != best}
    tied = [best] + [v for v, (se, _) in others.items() if mean(best) - mean(v) <= z * se]
    how = next(iter(others.values()))[1] if others else "one value"
    rows = [{"value": v, "mean": mean(v), "se": noise_se(v)} for v in values]
    noise = f"{how}; ties at z {z:.2f} (two-sided {ALPHA:.0%}, family-wise over {len(values) - 1} comparisons)"
    return Selection(model, dataset, param, mode, rows, best, sorted(tied), reference, reference_source, noise,
                     sorted(missing), z, noise_se(best) * expected_max(len(values)))


def select(model: str, dataset: str, param: str, mode: str, runs: dict[float, list[float]], n_validation: int,
           reference: float | None, reference_source: str, missing: list[float] = (),
           outcomes: dict[float, list[str]] | None = None) -> Selection:
    """``runs``: per swept value, the greedy validation accuracy of each seed's selected checkpoint; ``outcomes``:
    per value, each seed's per-question outcomes at that checkpoint (the selection's ``val_correct``)."""
    search = Search(runs, outcomes or {}, n_validation)
    values = sorted(runs)
    out = _selection(model, dataset, param, mode, values, search.mean, search.diff_se, reference, reference_source,
                     lambda v: value_stats(runs[v], n_validation)[1], missing)
    for row in out.values:
        row["accuracies"] = runs[row["value"]]
    return out


def combine(searches: dict[str, Search], model: str, param: str, mode: str, reference, reference_source,
            missing) -> Selection:
    """A model's selection over its train sets, each weighted equally (the paper reports one value per model): a
    value's score is the mean of its train sets' means (values run on every train set), a difference's error the
    root sum of the train sets' errors over their number (train sets are independent)."""
    values = sorted(set.intersection(*(set(s.accuracies) for s in searches.values())))
    n = len(searches)

    def mean(v):
        return statistics.fmean(s.mean(v) for s in searches.values())

    def diff_se(a, b):
        parts = [s.diff_se(a, b) for s in searches.values()]
        return math.sqrt(sum(se ** 2 for se, _ in parts)) / n, parts[0][1]

    def noise_se(v):
        return math.sqrt(sum(value_stats(s.accuracies[v], s.n_validation)[1] ** 2 for s in searches.values())) / n

    return _selection(model, COMBINED, param, mode, values, mean, diff_se, reference, reference_source, noise_se,
                      missing)


def across_modes(selections: list[Selection]) -> list[dict]:
    """Per (model, dataset, parameter) searched under several modes: whether they select the same value (the
    paper: "the same optimal rates were found for both hard and fuzzy"), and if not, whether their values
    within noise overlap."""
    groups: dict[tuple, list[Selection]] = {}
    for s in selections:
        groups.setdefault((s.model, s.dataset, s.param), []).append(s)
    out = []
    for (model, dataset, param), group in groups.items():
        if len(group) < 2:
            continue
        chosen = {s.mode: s.selected for s in group}
        same = len({round(v, 15) for v in chosen.values()}) == 1
        overlap = set.intersection(*({round(t, 15) for t in s.tied} for s in group))
        by_mode = ", ".join(f"{m} {value_text(param, v)}" for m, v in chosen.items())
        text = (f"{' and '.join(chosen)} select the same value ({value_text(param, next(iter(chosen.values())))})"
                if same else f"{by_mode}: " + ("not the same, but within noise of each other's"
                                               if overlap else "different, beyond noise"))
        out.append({"model": model, "dataset": dataset, "param": param, "selected": chosen, "same": same,
                    "overlap_within_noise": sorted(overlap), "statement": text})
    return out
