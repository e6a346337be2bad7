"""Which value a hyperparameter search selects, and whether the selection is a finding or noise.

The paper selected its learning rates and noise factor "using greedy validation performance" (Appendix D).
Here each run's number is its selected checkpoint's greedy validation pass@1 (the best validated step: the
checkpoint selection every run goes through), averaged over its seeds; the value with the highest mean is
selected. A selection is a finding only when no other value is within noise of it: two values are within
noise when their means differ by less than Z standard errors of the difference. A value's standard error is
its seeds' sample standard deviation over sqrt(seeds) with two seeds or more; with one seed it is the
validation set's binomial error alone (a lower bound: seed-to-seed spread is not measured), and the
selection says which. Both are choices a reader sees (``Selection.noise``, ``Z``)."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from softtokens.cells.spread import proportion_var
from softtokens.run.sweeps import SWEPT, variant_name

Z = 1.96   # two values within Z standard errors of their difference are within noise (a stated choice)


def value_text(param: str, value: float) -> str:
    """6e-06, 1.4e-04, 0.33: as the sweep's variant names write it."""
    return variant_name(param, value).removeprefix(SWEPT[param][1])


def value_stats(accuracies: list[float], n_validation: int) -> tuple[float, float, str]:
    """(mean, standard error, where the error comes from) of one value's runs."""
    k = len(accuracies)
    mean = statistics.fmean(accuracies)
    if k >= 2:
        return mean, statistics.stdev(accuracies) / math.sqrt(k), "seeds"
    # one seed: the validation set's binomial error of one run (cells.spread's proportion variance, in %;
    # add-one smoothed, so a 0 or 1 has one too)
    p = (mean * n_validation + 1) / (n_validation + 2)
    return (mean, math.sqrt(proportion_var(100 * p, n_validation)) / 100,
            "validation set only (one seed: seed-to-seed spread unmeasured)")


@dataclass
class Selection:
    """One search: a (model, dataset, swept parameter, training mode) and what it selected."""
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


def select(model: str, dataset: str, param: str, mode: str, runs: dict[float, list[float]], n_validation: int,
           reference: float | None, reference_source: str, missing: list[float] = ()) -> Selection:
    """``runs``: per swept value, the greedy validation accuracy of each seed's selected checkpoint."""
    values = []
    for value in sorted(runs):
        mean, se, noise = value_stats(runs[value], n_validation)
        values.append({"value": value, "mean": mean, "se": se, "accuracies": runs[value]})
    best = max(values, key=lambda v: v["mean"])   # the first of equal means: the smallest value
    tied = [v["value"] for v in values
            if best["mean"] - v["mean"] <= Z * math.sqrt(best["se"] ** 2 + v["se"] ** 2)]
    noise = value_stats(best["accuracies"], n_validation)[2]
    return Selection(model, dataset, param, mode, values, best["value"], tied, reference, reference_source, noise,
                     sorted(missing))


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
