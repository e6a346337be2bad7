"""One training run's settings, resolved once: the cell's RL settings with its overrides, its learning rate, mode,
seed and variant, the CoT cap of its validation, `auto` memory settings chosen by the memory plan, the processes
(GPUs) it trains on and the validation rows its data has. Made where a grid's jobs are made (grid.jobs.GridJobs.cell),
then read field by field by what prices, sizes or runs the run (cost.forecast, the workflow), instead of each reader
resolving the config again with getters that take the whole config and a grid name.

Why a type: a raw config dict and a grid name travelled down from the bill to getters on the lowest floor and back up
again 8 times on one call of `softtokens plan`; a change to how a cell resolves (a new override, a reading) had as many
places to be right in as there were readers."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class CellSettings:
    model: str
    dataset: str
    mode: str
    variant: str
    seed: int
    rl: Mapping = field(repr=False)   # the run's resolved settings (grid.jobs.GridJobs.train_settings), read-only
    processes: int                    # training processes, one per GPU (train_gpus under gpus_per_run)
    validation_rows: int              # greedy validation's questions: val_size, or fewer where the data has fewer

    def __post_init__(self):
        object.__setattr__(self, "rl", MappingProxyType(dict(self.rl)))

    @property
    def continuous(self) -> bool:
        return self.mode != "hard"

    @property
    def rows_per_step(self) -> int:
        """Rollouts of one RLOO step: prompts x samples per prompt (the paper's B x G)."""
        return int(self.rl["prompts_per_step"]) * int(self.rl["samples_per_prompt"])

    @property
    def decode_steps(self) -> int:
        """Decode steps of a rollout at its budget (CoT + the answer's), the prefill aside."""
        return int(self.rl["cot_max_tokens"]) + int(self.rl["answer_max_tokens"])

    @property
    def validation_decode_steps(self) -> int:
        """Decode steps of one greedy validation question at its CoT cap (a reading: config.readings)."""
        return int(self.rl["validation_cot_max_tokens"]) + int(self.rl["answer_max_tokens"])

    @property
    def validations(self) -> int:
        """Greedy validations of the run: the base's at step 0, then every val_every steps (the last included)."""
        return 1 + -(-int(self.rl["steps"]) // int(self.rl["val_every"]))
