"""A training checkpoint directory: the consolidated weights (``save_pretrained``), the tokenizer,
for resume the optimizer and schedule, and ``trainer_state.json``, the one file that says what
the checkpoint is. ``TrainerState`` owns that file's format: training writes it, resume, noise
scaling (sigma comes from the base model's E, recorded here), checkpoint selection and the
analysis scripts read it through this type, never by key on raw JSON.

The state is written last, with the size of every other file, so a directory without it was
never finished and a truncated file is caught before it is loaded (``checkpoint_problem``)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

STATE_FILE = "trainer_state.json"


@dataclass
class TrainerState:
    step: int                           # the last trained step the weights include
    best_val: float                     # best greedy validation among trained steps so far (-1: none)
    base_val: float | None              # greedy validation of the base model (step 0)
    embedding_scale: dict               # model.scale.EmbeddingScale of the base model: sets sigma
    sigma: float
    noise: dict                         # train.config.noise_record: what is noised, sigma's rule
    config: dict                        # the run's TrainConfig
    base_model: str
    base_revision: str | None           # the hub commit of the base weights (None: a local base)
    processes: int
    val_greedy_accuracy: float | None = None  # the best checkpoint's own score
    files: dict[str, int] = field(default_factory=dict)  # every other file's size in bytes

    @classmethod
    def read(cls, checkpoint: str | Path) -> "TrainerState":
        path = Path(checkpoint) / STATE_FILE
        data = json.loads(path.read_text())
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: unknown keys {', '.join(unknown)} (written by another version?)")
        return cls(**data)

    @classmethod
    def exists(cls, checkpoint: str | Path) -> bool:
        return (Path(checkpoint) / STATE_FILE).is_file()

    def write(self, checkpoint: str | Path) -> None:
        """Record the size of every file already in ``checkpoint``, then write the state (last)."""
        checkpoint = Path(checkpoint)
        self.files = {str(f.relative_to(checkpoint)): f.stat().st_size
                      for f in sorted(checkpoint.rglob("*")) if f.is_file() and f.name != STATE_FILE}
        (checkpoint / STATE_FILE).write_text(json.dumps(dataclasses.asdict(self), indent=1))


def checkpoint_problem(checkpoint: str | Path) -> str | None:
    """Why a saved checkpoint directory cannot be used (None if it can): its state file is
    missing or unreadable, or a file it lists is missing or has another size."""
    state_path = Path(checkpoint) / STATE_FILE
    try:
        state = TrainerState.read(checkpoint)
    except FileNotFoundError:
        return f"{state_path} is missing"
    except (OSError, ValueError, TypeError) as err:
        return f"{state_path} is unreadable ({type(err).__name__}: {err})"
    for name, size in state.files.items():
        f = Path(checkpoint) / name
        if not f.is_file():
            return f"{f} is missing"
        if f.stat().st_size != size:
            return f"{f} has {f.stat().st_size} bytes, {size} were written"
    return None
