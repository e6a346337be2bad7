"""What every command parses the same way: the settings JSON, the provenance expectations, the
model to evaluate (a base or a trained run's selected checkpoint)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def parse_settings(text: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"--settings is not valid JSON: {e}") from None


def require(settings: dict, *keys: str, command: str) -> None:
    """Stop, naming them, when settings the command needs are missing (the workflow gives all)."""
    missing = [k for k in keys if k not in settings]
    if missing:
        raise SystemExit(f"{command}: --settings lacks {', '.join(missing)} (softtokens.grid.jobs gives every one)")


def check_expected(expected) -> dict:
    from softtokens.store.provenance import StaleInput
    from softtokens.store.provenance import check_expected as check

    try:
        return check(expected or [])
    except StaleInput as err:
        raise SystemExit(f"stale input: {err}") from None


def add_expect(c: argparse.ArgumentParser) -> None:
    c.add_argument("--expect", nargs="*", default=[], metavar="PATH=HASH",
                   help="upstream outputs and the settings hash the current config gives them; a mismatch stops")


def add_model_args(c: argparse.ArgumentParser) -> None:
    """What to evaluate: a base model or a trained run's selected checkpoint; CPU threads; the names the result's
    identity gives them (store.eval_identity)."""
    g = c.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", help="base model: hub id or local directory")
    g.add_argument("--selected", help="selected.json of a trained run")
    c.add_argument("--model-name", help="the grid's name of the model (default: a trained run's model, else the "
                                        "base's directory name or hub id)")
    c.add_argument("--benchmark", help="the benchmark's name (default: the name of the data file's directory, as "
                                       "prepare-data lays it out)")
    c.add_argument("--threads", type=int, default=1)


def trained_identity(a) -> dict | str:
    """What the evaluated model is as a result's identity says it: "base", or the run of the selection read (its
    directory in the results layout; outside it, the checkpoint's own state)."""
    from softtokens.store.eval_identity import trained_identity as from_layout

    if not a.selected:
        return from_layout(None)
    try:
        return from_layout(a.selected)
    except (ValueError, IndexError):
        from softtokens.model.checkpoint import TrainerState

        chosen = read_selection(a.selected)
        cfg = TrainerState.read(chosen["checkpoint"]).config
        return {"model": None, "dataset": None, "mode": cfg.get("mode"), "variant": cfg.get("variant", ""),
                "seed": cfg.get("seed")}


def model_name(a) -> str:
    """The grid's name of the evaluated model (--model-name; else read off the selection's run or the base)."""
    if a.model_name:
        return a.model_name
    trained = trained_identity(a)
    if isinstance(trained, dict) and trained.get("model"):
        return trained["model"]
    return Path(a.model).name if a.model and Path(a.model).exists() else (a.model or "")


def benchmark_name(a) -> str:
    return a.benchmark or Path(a.data).parent.name


def read_selection(path: str | Path) -> dict:
    """A run's selected.json, or a one-line stop naming the file when it is not one (store.files.read_json)."""
    from softtokens.store.files import MalformedFile, read_json

    try:
        chosen = read_json(path)
    except MalformedFile as err:
        raise SystemExit(f"error: {err}") from None
    if not isinstance(chosen.get("checkpoint"), str):
        raise SystemExit(f"error: {path}: no checkpoint named in it (not a selection written by softtokens select)")
    return chosen


def selection_record(a) -> dict:
    """Which checkpoint of a trained run produced a result, and how it compared with its base on
    validation (tables mark runs selected below their base); nothing for a base model."""
    if not a.selected:
        return {}
    chosen = read_selection(a.selected)
    return {"selection": {k: chosen.get(k) for k in ("step", "val_greedy_accuracy", "base_val_greedy_accuracy",
                                                      "improved_over_base", "failed_to_learn")}}


def selection_checkpoint(selected: str | Path, chosen: dict) -> str:
    """The checkpoint a selection names, as a path here: the selection's record's paths are relative to its root
    (store.provenance.record_root), not to the reader's working directory."""
    from softtokens.store.provenance import at_root, record_root

    rec = chosen.get("provenance") if isinstance(chosen.get("provenance"), dict) else {}
    root = record_root(selected, rec) if rec else None
    return at_root(root, chosen["checkpoint"]).as_posix()


def model_to_evaluate(a) -> tuple[str, dict]:
    """The model path and the provenance inputs of a --model / --selected pair of arguments; a
    selected checkpoint is verified against what its training wrote before anything loads it."""
    if a.selected:
        from softtokens.train.selection import CheckpointError, identity_problem, verify_checkpoint

        chosen = read_selection(a.selected)
        model_path = selection_checkpoint(a.selected, chosen)
        try:
            verify_checkpoint(model_path)  # sizes and the record here; every byte as it loads (model.loading)
        except CheckpointError as err:
            raise SystemExit(f"error: {err}") from None
        problem = identity_problem(model_path, Path(a.selected).parent, chosen.get("step"))   # its run's own
        if problem:
            raise SystemExit(f"error: {problem}")
        return model_path, {"selected": a.selected, "checkpoint": model_path}
    from softtokens.store.provenance import made_by_workflow

    return a.model, ({"base_model": a.model} if Path(a.model).exists() and made_by_workflow(a.model) else {})


def record_base_model(prov, source: str, revision: str | None, background: bool = False) -> None:
    """A base model as the provenance chain sees it: a job's output (a built base) is an input, already in the
    record; a local directory is a leaf by its content; a hub id a leaf at the commit its weights came from."""
    from softtokens.store.provenance import hub_leaf, made_by_workflow

    if not Path(source).exists():
        prov.add_leaf("base_model", hub_leaf(source, revision))
    elif not made_by_workflow(source):
        prov.add_local_leaf("base_model", source, background=background)


def grid_config(a) -> tuple[dict, str]:
    """The config of ``--config`` with the grid ``--grid`` names (default: the config's), and its grid
    file (grids/NAME.yaml), checked as the workflow checks it before any job (workflow.startup.check_grid)."""
    from softtokens.workflow.startup import check_grid
    from softtokens.config.grids import ConfigError, read_config

    try:
        config, files = read_config(a.config, a.grid)
        check_grid(config, config["grid"], files)
    except ConfigError as err:
        raise SystemExit(str(err)) from None
    return config, config["grid"]
