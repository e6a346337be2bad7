"""What a claim module declares: the paper's sentence, the rule read off its words, the margin it
reads sameness by, and how it plans its comparisons on a set of cells.

Why declarative: a claim is the paper's words plus a plan of comparisons; the statistics that turn
a plan into a verdict (verdict.judging) are the same for every claim and every specification, so a
new claim is one module declaring a ClaimDef (and its test), found by verdict.claims.registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from softtokens.verdict.judging import PartPlan


@dataclass(frozen=True)
class Context:
    """What a plan may need besides the cells."""

    metric: str | None                  # the grid's pass@k (the largest k; the paper's pass@32)
    entropy: pd.DataFrame | None        # per-file mean CoT entropies (judging.entropy_rows); None: none given


@dataclass(frozen=True)
class ClaimDef:
    key: str
    order: int                          # where the report lists it
    statement: str                      # the claim in one line ({metric}: the grid's pass@k)
    quotes: tuple[dict, ...]            # the paper's words (judging.quote), checked against its source by a test
    rule: str                           # the rule in words ({metric}, {margin}, {unit} filled in)
    plan: Callable[[dict, Context], list[PartPlan] | None]   # None: these numbers cannot judge it
    margin: str | None = None           # the verdict.choices.MARGINS kind it reads sameness by
    source: str = "paper"               # "ours": a statement of ours, not a sentence of the paper

    def words(self, metric: str | None, margin: float | None, unit: str | None) -> tuple[str, str]:
        """(statement, rule) with the grid's metric and the claim's margin filled in."""
        fill = {"metric": metric or "pass@k", "margin": f"{margin:g}" if margin is not None else "",
                "unit": unit or ""}
        return self.statement.format(**fill), self.rule.format(**fill)
