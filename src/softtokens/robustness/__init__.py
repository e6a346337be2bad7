"""How far a verdict holds: under every combination of the choices it rests on (``multiverse``: distinct
specifications, the fewest choices that flip it, the margin curve, the paper's own reading), in simulated
reproductions of the paper's grid (``reproducibility``: each verdict's odds), what grid would settle a set of
claims (``claim_plan``: `plan --claims`), and the paper's claims judged on its own numbers with all of it
(``paper_verdicts``: the paper_claims job).

Why a room above the verdict's: the verdict (verdict/) is one reading of the paper's words; this room asks how much
that reading, and the data under it, could move it. A contributor changing a rule works below; one asking "would it
hold" works here."""
