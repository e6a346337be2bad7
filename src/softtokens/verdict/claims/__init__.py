"""The paper's claims as it states them, each judged on our numbers and on the paper's own.

Why: a reader adopts a reproduction for its verdict, so a claim is the paper's sentence (quoted,
with its place in the LaTeX source) and a rule read off its words, not our paraphrase. One module
per claim (or family of claims read by one rule) declares a ClaimDef: its words, its rule, the
margin it reads sameness by, and the comparisons it plans on the cells; verdict.judging turns the
plan into a verdict, verdict.choices holds every choice under it. A new claim is one module here
plus its test. docs/protocol.md discusses each.
"""

from softtokens.verdict.claims.define import ClaimDef, Context
from softtokens.verdict.claims.judge import (
    MarginError,
    judge_claim,
    judge_claims,
    judge_paper_claims,
    judge_set,
    judging_spec,
    margin_problems,
    our_index,
    paper_index,
    plans_for,
    precedence_sensitivity,
    registry,
)

__all__ = ["ClaimDef", "Context", "MarginError", "judging_spec", "margin_problems", "our_index", "judge_claim", "judge_claims", "judge_paper_claims", "judge_set", "paper_index", "plans_for",
           "precedence_sensitivity", "registry"]
