"""The paper's claims judged on the paper's own numbers, as a result of its own: every specification (one at a time and
every combination: robustness.multiverse), each verdict's odds in simulated reproductions, and which verdicts turn on the table a disagreeing cell is read from.

Why a job apart from the reproduction report: none of it rests on a grid's results (the published numbers and the
config's judging block are its only inputs), so the workflow makes it beside a grid's first jobs (on a laptop, while
the toy base is supervised) instead of after its last, where it was most of the report job's 10 s on a 2-core host."""

from __future__ import annotations

import dataclasses

import pandas as pd

from softtokens.robustness.multiverse import paper_claims
from softtokens.verdict.claims import precedence_sensitivity
from softtokens.verdict.choices import Spec
from softtokens.verdict.judged import Claim
from softtokens.robustness.reproducibility import paper_reproducibility

FIELDS = tuple(f.name for f in dataclasses.fields(Claim))


def paper_verdicts(paper: pd.DataFrame, spec: Spec) -> dict:
    """The paper's claims (records, verdict.judged.Claim.record) at ``spec`` and under every alternative, with their
    odds in reproductions and the precedence sensitivity (reproduction.paper_conflicts' readings)."""
    claims = paper_claims(paper, spec)
    odds = paper_reproducibility(paper, spec=spec)
    for c in claims:
        c.reproducibility = odds[c.key].record() if c.key in odds else None
    return {"claims": [c.record() for c in claims],
            "precedence_sensitivity": [list(t) for t in precedence_sensitivity(paper, claims, spec)]}


def claims_from(doc: dict) -> list[Claim]:
    """The Claim objects a paper_verdicts document holds (its records less what record() derives)."""
    return [Claim(**{k: v for k, v in r.items() if k in FIELDS}) for r in doc["claims"]]
