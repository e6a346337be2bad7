"""Pick the checkpoint used for testing: the best greedy validation score among trained steps
(Section 4: 'the final model used for testing is the best performing under our greedy
validation'). Step 0 is the untouched base model: it is validated as the reference a trained
checkpoint is compared with, never selected, so a table never reports the base under a
training row. Whether the selected checkpoint beat the base is recorded beside the choice."""

from __future__ import annotations

from pathlib import Path

# A run whose best trained step answers no validation question right has learned nothing usable,
# whatever its base scored (a diverged run: every validation 0.0); one below its base was made worse.
FLOOR = 0.0


def select_best(metrics: list[dict]) -> dict:
    """The trained (step >= 1) validation row with the highest greedy accuracy, ties to the
    earliest step; with the base model's step-0 accuracy, whether the choice improved on it, and
    ``failed_to_learn``: why the run's best is no trained model worth comparing (below its base, or at
    or below FLOOR), None when it is."""
    vals = [m for m in metrics if m.get("kind") == "validation"]
    trained = [m for m in vals if m["step"] >= 1]
    if not trained:
        raise ValueError("no validation of a trained step (>= 1) in metrics: the run validated nothing it trained")
    best = max(trained, key=lambda m: (m["val_greedy_accuracy"], -m["step"]))
    base = next((m["val_greedy_accuracy"] for m in vals if m["step"] == 0), None)
    acc = best["val_greedy_accuracy"]
    failed = None
    if base is not None and acc < base:
        failed = f"its best trained step ({best['step']}) validates at {acc:.3f}, below its base model's {base:.3f}"
    elif acc <= FLOOR:
        failed = (f"no trained step answers a validation question right (best {acc:.3f} at step {best['step']}, "
                  f"at or below the floor {FLOOR:g}): it diverged or learned nothing")
    return {"step": best["step"], "val_greedy_accuracy": acc,
            "base_val_greedy_accuracy": base,
            "improved_over_base": None if base is None else acc > base,
            "failed_to_learn": failed,
            "validated_steps": [m["step"] for m in vals],
            # each validation question's outcome at that step ("1": right), where the run recorded them
            **({"val_correct": best["val_correct"]} if "val_correct" in best else {})}


class CheckpointError(RuntimeError):
    """A checkpoint that is not what its training wrote; the message names the path and the fault."""


def verify_checkpoint(checkpoint: str | Path, content: bool = False) -> None:
    """A checkpoint as its training wrote it: every file its manifest lists (model.checkpoint) there
    with its size (and, with ``content``, its sha256: every byte read), and the directory's sha256 the
    one its training's provenance record holds (where store.provenance.record_path puts it), computed
    from the manifest's hashes. A load checks the content as it reads (model.loading); selection reads
    every byte here, before any evaluation rests on it."""
    from softtokens.model.checkpoint import checkpoint_problem, manifest_sha256
    from softtokens.store.files import MalformedFile, read_json, sha256_path
    from softtokens.store.provenance import record_path

    checkpoint = Path(checkpoint)
    fix = "Restore the file, or retrain the run (snakemake --forcerun train <its metrics.jsonl>)."
    problem = checkpoint_problem(checkpoint, content)
    if problem:
        raise CheckpointError(f"checkpoint {checkpoint} refused: {problem}. {fix}")
    record = record_path(checkpoint)
    if record.is_file():
        try:
            want = (read_json(record).get("output") or {}).get("sha256")
        except MalformedFile as err:
            raise CheckpointError(f"checkpoint {checkpoint} refused: its record is unreadable: {err}. {fix}") from None
        got = manifest_sha256(checkpoint) or sha256_path(checkpoint)
        if want and got != want:
            raise CheckpointError(f"checkpoint {checkpoint} refused: its files are not those its training recorded "
                                  f"(directory sha256 {got[:12]}, {record} says {want[:12]}). {fix}")


def check_checkpoint(checkpoint: Path, step: int) -> None:
    from softtokens.model.checkpoint import TrainerState

    held = TrainerState.read(checkpoint).step
    if held != step:
        raise ValueError(f"{checkpoint} holds step {held}, but validation picks step {step}")


def identity_problem(checkpoint: str | Path, run_dir: str | Path, step: int | None = None) -> str | None:
    """Whether a checkpoint is its run's own (None) or another's: the run is its directory (runs/MODEL/DATA/ARM/
    seedS, as store.paths lays it out, and the training record beside its metrics); the checkpoint carries its own
    state (trainer_state.json: mode, seed, variant, step) and the record of the training that wrote it (where it
    was written, its settings' hash, when it started). Two runs' `best` folders swapped, or one copied from
    another run or grid, are whole checkpoints with valid manifests: only their identity tells them apart. ``step``:
    the step the run's selection chose. Returns the problem, naming the run the checkpoint is really from."""
    from softtokens.model.checkpoint import STATE_FILE, TrainerState
    from softtokens.store.paths import METRICS, SELECTED, parse_run_path
    from softtokens.store.provenance import read_record, record_root

    checkpoint, run_dir = Path(checkpoint), Path(run_dir)
    shared = share_of(run_dir)   # a run that is another's name: the checkpoint is that run's
    if shared is not None:
        problem = share_problem(run_dir / SELECTED)
        if problem:
            return problem
        run_dir = shared
    if not TrainerState.exists(checkpoint):
        return (f"checkpoint {checkpoint} has no {STATE_FILE}: not a checkpoint the trainer wrote, so whose run it "
                f"is cannot be told. Nothing was computed from it: retrain the run "
                f"(snakemake --forcerun train {run_dir / METRICS})")
    state = TrainerState.read(checkpoint)
    held = {"mode": state.config.get("mode"), "seed": state.config.get("seed"), "variant": state.config.get("variant", "")}
    ckpt_rec, run_rec = read_record(checkpoint) or {}, read_record(run_dir / METRICS) or {}
    try:
        keys = parse_run_path(run_dir / METRICS)
        want = {"mode": keys["train_mode"], "seed": keys["seed"], "variant": keys["variant"]}
    except ValueError:   # a run outside the layout (softtokens select by hand): its training record says what it is;
        cfg = run_rec.get("config") or {}   # with neither, nothing to hold it to (a workflow run always has both)
        want = {"mode": cfg.get("mode"), "seed": cfg.get("seed"), "variant": cfg.get("variant", "")} if cfg else held
    origin = (ckpt_rec.get("output") or {}).get("path")
    why = []
    if held != want:
        why.append(f"its state is of a {held['mode']} run, seed {held['seed']}"
                   + (f", variant {held['variant']}" if held["variant"] else ""))
    if origin and record_root(checkpoint, ckpt_rec) is None:   # not where its training wrote it
        why.append(f"its training wrote it as {origin}")
    if run_rec and ckpt_rec and (ckpt_rec.get("config_hash"), ckpt_rec.get("started")) != (
            run_rec.get("config_hash"), run_rec.get("started")):
        why.append(f"it was written by a training job with settings {ckpt_rec.get('config_hash')} started "
                   f"{ckpt_rec.get('started')}, the run's by one with {run_rec.get('config_hash')} started "
                   f"{run_rec.get('started')}")
    if step is not None and state.step != step:
        why.append(f"it holds step {state.step}, the run's selection chose step {step}")
    if not why:
        return None
    return (f"checkpoint {checkpoint} is not run {run_dir}'s: " + "; ".join(why) + ". Nothing was computed from it: "
            f"put the run's own checkpoint back, or retrain the run (snakemake --forcerun train {run_dir / METRICS})")


SHARED_WITH = "shared_with"   # in a selected.json: the run directory whose selection (and files) it shares


def share_of(run_dir: str | Path) -> Path | None:
    """The run another run's name points at (its selected.json's SHARED_WITH), None for a run of its own."""
    from softtokens.store.paths import SELECTED

    from softtokens.store.files import MalformedFile, read_json
    from softtokens.store.provenance import at_root, record_root

    sel = Path(run_dir) / SELECTED
    try:
        doc = read_json(sel) if sel.is_file() else {}
    except MalformedFile:
        return None
    other = doc.get(SHARED_WITH)
    if not isinstance(other, str):
        return None
    return at_root(record_root(sel, doc.get("provenance") or {}), other)


def share_problem(selected: str | Path) -> str | None:
    """Whether a shared selection (softtokens select --share) is one: the run it names computes what this name asks
    for (the same model and training set; the same settings less the name and memory-only keys: grid.identity),
    held against that run's training record, not against what the shared file says of itself."""
    from softtokens.config.grids import computing_settings
    from softtokens.store.paths import METRICS, parse_run_path
    from softtokens.store.provenance import read_record

    selected = Path(selected)
    asked = (read_record(selected) or {}).get("config") or {}
    other = share_of(selected.parent)
    trained = (read_record(other / METRICS) or {}).get("config") if other else None
    if other is None or trained is None:
        return f"{selected} shares a run that is not there ({other})"
    mine, theirs = parse_run_path(selected), parse_run_path(other / METRICS)
    same_cell = (mine["model"], mine["train_dataset"]) == (theirs["model"], theirs["train_dataset"])
    if not same_cell or computing_settings(asked) != computing_settings(trained):
        diff = sorted(k for k in set(computing_settings(asked)) | set(computing_settings(trained))
                      if asked.get(k) != trained.get(k))
        return (f"{selected} shares run {other}, which does not compute what it asks for "
                f"({'another model or training set' if not same_cell else 'settings ' + ', '.join(diff) + ' differ'})")
    return None
