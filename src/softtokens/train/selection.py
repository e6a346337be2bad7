"""Pick the checkpoint used for testing: the best greedy validation score among trained steps
(Section 4: 'the final model used for testing is the best performing under our greedy
validation'). Step 0 is the untouched base model: it is validated as the reference a trained
checkpoint is compared with, never selected, so a table never reports the base under a
training row. Whether the selected checkpoint beat the base is recorded beside the choice."""

from __future__ import annotations

import json
from pathlib import Path


def select_best(metrics: list[dict]) -> dict:
    """The trained (step >= 1) validation row with the highest greedy accuracy, ties to the
    earliest step; with the base model's step-0 accuracy and whether the choice improved on it."""
    vals = [m for m in metrics if m.get("kind") == "validation"]
    trained = [m for m in vals if m["step"] >= 1]
    if not trained:
        raise ValueError("no validation of a trained step (>= 1) in metrics: the run validated nothing it trained")
    best = max(trained, key=lambda m: (m["val_greedy_accuracy"], -m["step"]))
    base = next((m["val_greedy_accuracy"] for m in vals if m["step"] == 0), None)
    return {"step": best["step"], "val_greedy_accuracy": best["val_greedy_accuracy"],
            "base_val_greedy_accuracy": base,
            "improved_over_base": None if base is None else best["val_greedy_accuracy"] > base,
            "validated_steps": [m["step"] for m in vals]}


class CheckpointError(RuntimeError):
    """A checkpoint that is not what its training wrote; the message names the path and the fault."""


def verify_checkpoint(checkpoint: str | Path) -> None:
    """Before a checkpoint is evaluated: every file its training listed (model.checkpoint.TrainerState) is there
    with the size written, and the directory's sha256 is the one its training's provenance record
    gives (a truncated or edited file fails here, naming itself, instead of deep inside a loader)."""
    from softtokens.model.checkpoint import checkpoint_problem
    from softtokens.run.files import sha256_path
    from softtokens.run.provenance import sidecar_path

    checkpoint = Path(checkpoint)
    problem = checkpoint_problem(checkpoint)
    if problem:
        raise CheckpointError(f"checkpoint {checkpoint} cannot be evaluated: {problem}. Retrain the run "
                              f"(snakemake --forcerun train <its metrics.jsonl>) or restore the file.")
    record = sidecar_path(checkpoint)
    if record.is_file():
        want = (json.loads(record.read_text()).get("output") or {}).get("sha256")
        if want and sha256_path(checkpoint) != want:
            raise CheckpointError(f"checkpoint {checkpoint} cannot be evaluated: its files changed since its training "
                                  f"wrote them (sha256 differs from {record}). Retrain the run or restore the files.")


def check_checkpoint(checkpoint: Path, step: int) -> None:
    from softtokens.model.checkpoint import TrainerState

    held = TrainerState.read(checkpoint).step
    if held != step:
        raise ValueError(f"{checkpoint} holds step {held}, but validation picks step {step}")
