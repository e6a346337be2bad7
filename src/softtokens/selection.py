"""Pick the checkpoint used for testing: the best greedy validation score (Section 4: 'the
final model used for testing is the best performing under our greedy validation')."""

from __future__ import annotations

import json
from pathlib import Path


def select_best(metrics: list[dict]) -> dict:
    """The validation row with the highest greedy accuracy; ties go to the earliest step."""
    vals = [m for m in metrics if m.get("kind") == "validation"]
    if not vals:
        raise ValueError("no validation rows in metrics: the run validated nothing")
    best = max(vals, key=lambda m: (m["val_greedy_accuracy"], -m["step"]))
    return {"step": best["step"], "val_greedy_accuracy": best["val_greedy_accuracy"],
            "validated_steps": [m["step"] for m in vals]}


def check_checkpoint(checkpoint: Path, step: int) -> None:
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    if state["step"] != step:
        raise ValueError(f"{checkpoint} holds step {state['step']}, but validation picks step {step}")
