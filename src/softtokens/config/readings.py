"""Settings that read what the paper does not say, each stated: its default, why, and the alternative one setting
away (`softtokens config` prints them for a grid; the reproduction report lists them beside its choices)."""

from __future__ import annotations

from softtokens.config.grids import EVAL_DEFAULTS

# setting -> (what it decides and why its default, the alternative)
READINGS = {
    "validation_cot_max_tokens": (
        "greedy validation's CoT cap (it decides which checkpoint is selected: every GSM8K cell, the sweep's "
        "statistic). Default `training`: the run's own cap (128 on GSM8K, 512 on MATH and DeepScaleR), as the run "
        "is trained; the paper says neither this nor the test's",
        "`evaluation`: the test's cap (512), the length the selected checkpoint is tested at"),
}


def validation_cot_cap(rl: dict, evaluation: dict | None = None) -> int:
    """The CoT cap of greedy validation (rl's ``validation_cot_max_tokens``): the run's own cap (`training`), the
    grid's evaluation cap (`evaluation`) or a number."""
    choice = rl["validation_cot_max_tokens"]
    if choice == "training":
        return int(rl["cot_max_tokens"])
    if choice == "evaluation":
        if evaluation is None:
            raise ValueError("validation_cot_max_tokens: evaluation needs the grid's evaluation block")
        return int({**EVAL_DEFAULTS, **evaluation}["cot_max_tokens"])
    return int(choice)
