"""Every choice a verdict on a claim depends on, named, with its default, its reason and the
alternatives a careful reader could defend (the report judges every claim under each of them).

Why one home: the arithmetic of a verdict is easy to check; the choices under it are not, unless
they are written down. A reviewer who recomputed every count still could not see that "similar"
was read as "not significantly different" (so more noise passed more claims), that the paper's
± was read as a sample std, or that one run's seeds counted as independent on three benchmarks.
Each such choice is a field of ``Spec``; ``CHOICES`` says why its default is what it is and which
alternatives the report tries ("what would flip it"). docs/protocol.md's table of them is
generated from here (report.doc_blocks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

# ---------------------------------------------------------------- margins ("similar" by how much)
POINTS, NLL, RATIO = "points", "nll", "ratio"


@dataclass(frozen=True)
class Margin:
    value: float
    unit: str
    why: str


# The equivalence margin of a claim of sameness ("similar", "comparable", "matching", "preserve",
# "recover", "no benefit"): a difference inside +-margin counts as the same. A claim names which
# of these it reads; `judging.margins.<claim>` in config.yaml overrides it for one claim.
MARGINS = {
    POINTS: Margin(2.5, "percentage points",
                   "A stated practical threshold, fixed in this file before any run of ours and not estimated from any "
                   "claim's numbers: 2.5 points is one question in 40, the size of difference a reader of a math "
                   "benchmark's leaderboard treats as noise (a 500-question set's binomial standard error near 70% is "
                   "2.0 points for one evaluation). The paper names no number ('statistically similar'), so the verdict "
                   "is also shown across every margin from 0.25 to 10 points (the margin curve: where it changes is "
                   "the finding). Used for every percentage (pass@1, pass@k, accuracy)."),
    RATIO: Margin(round(math.log(1.5), 4), "in log ratio (a factor of 1.5)",
                  "A stated practical threshold for 'roughly the same': a mean CoT entropy within a factor of 1.5 of the "
                  "base model's (the log of the ratio within ±0.405), fixed before any run of ours; the paper shows "
                  "entropy as figures only, so no number of it enters. Shown across factors 1.05 to 3 as well."),
    NLL: Margin(0.1, "nats per token",
                "A stated practical threshold, not an estimate: a per-token likelihood within 10% (e^0.1 = 1.105) of the "
                "reference's. (An earlier margin, half of hard training's +0.19-nat rise, was the estimate of the "
                "same claim's 'hard degrades' part: a margin taken from the data it judges.) The paper names no "
                "number, so the verdict is shown across every margin from 0.01 to 0.5 nats as well."),
}

# the range each margin's curve is drawn over (robustness.multiverse.margin_curve): the verdict at each margin, so
# that where it changes is shown, not only the verdict at the stated one
MARGIN_RANGES = {POINTS: tuple(round(0.25 * i, 2) for i in range(1, 41)),
                 NLL: tuple(round(0.01 * i, 2) for i in range(1, 51)),
                 RATIO: tuple(round(math.log(1 + 0.05 * i), 4) for i in range(1, 41))}

# ---------------------------------------------------------------- quantifiers
# "most": more than half of the units; "every" (or an unqualified statement): all of them;
# "generally": at least Spec.generally of them; "on average": one contrast, its mean
MOST, GENERALLY, EVERY, AVERAGE = "most", "generally", "every", "on average"

# ---------------------------------------------------------------- the specification
PAIRED, UNPAIRED, NO_TEST_SET = "paired", "unpaired", "none"
WIDEN = "widening side"            # a run's seed correlation: 0 or 1, whichever widens the comparison's interval
SIMULATED_RHO = 0.5                # the truth's correlation in a simulated reproduction when the judge reads WIDEN
ROUNDING_BOUND, ZERO = "rounding bound", "zero"   # a printed ±0.0: the largest std it rounds from, or exactly 0
WORDS, TWO_SIDED = "per the words", "two-sided"   # 'competitive', 'matching', 'does not degrade': one-sided
FAMILY_WISE, PER_COMPARISON = "family-wise", "per comparison"
SENTENCE_UNIT, COMPARISON_UNIT = "sentence", "comparison"


@dataclass(frozen=True)
class Spec:
    """One reading of every choice (CHOICES: what each field means and why its default)."""

    alpha: float = 0.05                 # each one-sided test's level; a quantified claim's family-wise level
    dist: str = "t"                     # "t": Student t, Welch-Satterthwaite df from the seeds; "z": normal
    paper_ddof: int = 0                 # the paper's ±: 0 population std (numpy's default), 1 sample std
    test_set: str = PAIRED              # the questions' variance: paired (ours), unpaired, none
    rho: float | str = WIDEN            # correlation of one training run's seed errors across its cells
    question_rho: float = 0.0           # unpaired cells of one benchmark: their test-set errors' correlation
    reproduction_question_rho: float = 0.5  # the same, in a reproduction made here (plan --claims, its judge)
    nll_row_cv: float = 1.0             # the paper's NLL per question: spread / mean (its test-set term)
    zero_std: str = ROUNDING_BOUND      # a printed ±0.0 (±0.00) of a trained cell: its rounding bound, or 0
    reading: str = WORDS                # 'competitive' / 'not degrade': one-sided (the words), or two-sided
    margin_scale: float = 1.0           # every margin times this
    generally: float = 2 / 3            # the share "generally" asks for
    generally_strict: bool = False      # "generally" as strictly more than that share
    multiplicity: str = FAMILY_WISE     # how a quantifier counts: family-wise (partial conjunction) or raw
    unit: str = SENTENCE_UNIT           # what a quantifier counts: the unit the sentence names, or comparisons
    margins: tuple[tuple[str, float], ...] = field(default=())   # per-claim overrides (config.yaml judging.margins)

    def margin(self, claim: str, kind: str | None) -> float:
        """The margin a claim judges sameness by under this specification (0 for a claim without one)."""
        if kind is None:
            return 0.0
        override = dict(self.margins).get(claim)
        return (MARGINS[kind].value if override is None else float(override)) * self.margin_scale

    @property
    def simulated_rho(self) -> float:
        """The seed correlation a simulated reproduction draws with (a number: WIDEN is a reading, not a truth)."""
        return SIMULATED_RHO if self.rho == WIDEN else min(max(float(self.rho), 0.0), 1.0)

    def with_margins(self, margins: dict | None) -> "Spec":
        return replace(self, margins=tuple(sorted((margins or {}).items())))


DEFAULT = Spec()

# The paper's own reading, as far as its words show it: its ± is the seeds' spread alone (no test-set term), and
# "statistically similar" is read against a normal reference. Judged beside ours (robustness.multiverse), with why the
# two differ (PAPER_READING_WHY).
PAPER_READING = Spec(test_set=NO_TEST_SET, dist="z")
PAPER_READING_NAME = "the paper's reading"
PAPER_READING_WHY = ("ours adds the test set's sampling error (the questions are a sample: 500 MATH-500 questions "
                     "leave ±3.7 points at 90% on their own) and reads three seeds with Student's t, not a normal")


@dataclass(frozen=True)
class Choice:
    """One choice: the field it sets, why the default, and the alternatives the report tries."""

    name: str
    field: str
    why: str
    alternatives: tuple[tuple[str, dict], ...]   # (label, fields changed)
    sources: tuple[str, ...] = ("paper", "ours")  # whose numbers it can change
    shown: str | None = None                       # the default in words, where the field's value is not it

    def default_text(self, spec: "Spec" = None) -> str:
        value = getattr(spec or DEFAULT, self.field)
        return self.shown or (f"{value:.3g}" if isinstance(value, float) else str(value))


CHOICES = (
    Choice("level", "alpha",
           "Each one-sided test at 0.05, so a claim of sameness reads a 90% interval (the usual two one-sided "
           "tests); a quantified claim is held at 0.05 family-wise (multiplicity, below).", ()),
    Choice("margin", "margin_scale",
           "A claim of sameness is supported only when the difference's confidence interval lies inside +-margin "
           "(two one-sided tests), contradicted when it lies outside, undecided otherwise: more noise can only "
           "make a verdict undecided. The margins and why: MARGINS.",
           (("margin x0.5", {"margin_scale": 0.5}), ("margin x2", {"margin_scale": 2.0})),
           shown=", ".join(f"{m.value:g} {m.unit}" for m in MARGINS.values())),
    Choice("distribution", "dist",
           "The seeds' spread is estimated from 2-3 seeds: Student t with Welch-Satterthwaite degrees of freedom "
           "(each training run's seeds a component of n-1 df, the test-set term infinite df), so a contrast "
           "dominated by the test set is judged as by z and one resting on three seeds is not.",
           (("normal z", {"dist": "z"}),)),
    Choice("the paper's ±", "paper_ddof",
           "Population std (ddof 0). ARC-Challenge's accuracies (two decimals, 1,165 questions, 3 seeds) admit "
           "a seed triple of integer counts matching the printed mean and std for all 15 trained cells read as "
           "a population std and for only 9 read as a sample std: 6 printed values cannot be a sample std "
           "(cells.paper.admitted_ddof; the other tables cannot tell them apart). The seeds' variance of a "
           "mean is then std^2/(n-1), not std^2/n.",
           (("± as sample std", {"paper_ddof": 1}),), sources=("paper",)),
    Choice("test-set term", "test_set",
           "The questions are a sample too. Ours: paired, the variance over questions of the per-question "
           "difference (both cells scored on the same questions). The paper's means cannot be paired: each "
           "cell's binomial variance at its benchmark's size, unpaired (larger than paired: the safe side, "
           "now that more variance can only make a verdict undecided).",
           (("no test-set term", {"test_set": NO_TEST_SET}), ("unpaired test-set term", {"test_set": UNPAIRED}))),
    Choice("seed correlation", "rho",
           "One training run (its seeds) is scored on every benchmark and inference setting, so its cells' seed "
           "errors are correlated; the paper gives no per-seed numbers to measure it. Read at the side that widens "
           "each comparison's interval: a difference of two cells of one run is widest with the seeds independent "
           "(0), a sum with one shared seed effect (1); the variance is linear in the correlation, so one of the "
           "two bounds is the widest any correlation in [0, 1] gives. Tried: 0, 0.5 (the old default, which "
           "narrows a like-for-like difference) and 1. Ours is measured: the per-seed values of one run's cells "
           "give each contrast's seed variance directly.",
           (("seeds uncorrelated", {"rho": 0.0}), ("seeds correlated 0.5", {"rho": 0.5}),
            ("seeds fully correlated", {"rho": 1.0})), sources=("paper",)),
    Choice("a printed ±0.0", "zero_std",
           "A trained cell's printed ±0.0 (±0.00 in the out-of-domain table) says its std is below 0.05 (0.005), "
           "not that it is zero: read at that bound, the widest std it rounds from (15 of the paper's trained "
           "cells print ±0). Tried: exactly zero (a comparison of two such cells then has no seed error).",
           (("±0.0 read as exactly 0", {"zero_std": ZERO}),), sources=("paper",)),
    Choice("'competitive', 'does not degrade'", "reading",
           "Where the words are one-sided ('competitive with', 'matching', 'does not degrade'), the claim is "
           "non-inferiority: the difference's interval above -margin, so a large gain does not count against it. "
           "Where they are two-sided ('similar', 'comparable'), two one-sided tests. Tried: every such claim read "
           "two-sided.",
           (("'competitive' read two-sided", {"reading": TWO_SIDED}),)),
    Choice("question correlation", "question_rho",
           "Two cells of one benchmark were scored on the same questions, so their test-set errors correlate; "
           "the paper publishes no per-question results to pair them on. 0: the unpaired bound (the larger "
           "variance: the safe side now that it can only make a verdict undecided). Tried: 0.5, about the "
           "median correlation of two models' per-question results on the toy's evaluation files (0.21-0.78 "
           "between trained models; 0.43 greedy, 0.63 sampled). Ours are paired, question by question.",
           (("questions correlated 0.5", {"question_rho": 0.5}),), sources=("paper",)),
    Choice("question correlation in a reproduction", "reproduction_question_rho",
           "A reproduction made with this project compares two of its cells paired, question by question; the "
           "planner (`plan --claims`) simulates reproductions from the paper's means, which carry no per-question "
           "results, so it reads two cells of one benchmark as unpaired with this correlation, and judges and draws "
           "them alike (robustness.reproducibility draws each benchmark's test-set error once per reproduction, each "
           "cell taking it with this correlation). 0.5: about the median of the toy's trained models (0.43 greedy, "
           "0.63 sampled). Not a choice of the verdicts on the paper's or our numbers.", (), sources=("reproduction",)),
    Choice("NLL spread", "nll_row_cv",
           "The paper gives NLL means only; the per-question spread of a per-token NLL is taken as its mean "
           "(coefficient of variation 1), so a cell's test-set variance is mean^2/N. Halved and doubled tried.",
           (("NLL spread x0.5", {"nll_row_cv": 0.5}), ("NLL spread x2", {"nll_row_cv": 2.0})), sources=("paper",)),
    Choice("'generally'", "generally",
           "At least two thirds of the units. Tried: more than half (as loose as 'most') and three quarters.",
           (("'generally' > 1/2", {"generally": 0.5, "generally_strict": True}),
            ("'generally' >= 3/4", {"generally": 0.75}))),
    Choice("multiplicity", "multiplicity",
           "A quantifier over k comparisons asks that at least m of them hold: supported when the m-th smallest "
           "p-value times (k-m+1) is at most alpha (Benjamini and Heller's partial conjunction test, Bonferroni "
           "form; 'every' is then the intersection-union test, each comparison at alpha), contradicted when "
           "k-m+1 failures are established the same way, so thirty comparisons do not fail 'every' by chance "
           "alone. Tried: each comparison at alpha, counted raw.",
           (("raw counts", {"multiplicity": PER_COMPARISON}),)),
    Choice("unit of count", "unit",
           "Where the sentence names its unit ('most model-dataset combinations'), a unit holds when every "
           "comparison in it does; elsewhere the comparisons are the units. Tried: every comparison a unit.",
           (("every comparison a unit", {"unit": COMPARISON_UNIT}),)),
)


def alternatives(source: str, base: Spec = DEFAULT) -> list[tuple[str, Spec]]:
    """(label, specification) of the default and of each alternative that can change ``source``'s
    numbers ("paper" or "ours"), one choice changed at a time."""
    out = [("default", base)]
    for choice in CHOICES:
        if source in choice.sources:
            out += [(label, replace(base, **changes)) for label, changes in choice.alternatives]
    return out
