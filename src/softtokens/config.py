"""config.yaml: schema validation with messages that name the offending key, cross-checks the
schema cannot express, and the resolved RL settings of a grid (paper defaults + overrides)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """config.yaml is malformed; the message names the key."""


def _key_path(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def validate_schema(config: dict, schema_path: Path = SCHEMA_PATH) -> None:
    import jsonschema

    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if not errors:
        return
    lines = []
    for e in errors:
        where = _key_path(e.absolute_path)
        if e.validator == "additionalProperties":
            known = sorted(e.schema.get("properties", {}))
            extra = sorted(set(e.instance) - set(known)) if isinstance(e.instance, dict) else []
            for key in extra:
                full = f"{where}.{key}" if e.absolute_path else key
                hint = f" (known keys: {', '.join(known)})" if known else ""
                lines.append(f"unknown key '{full}'{hint}")
        else:
            lines.append(f"'{where}': {e.message}")
    raise ConfigError("invalid config.yaml:\n  " + "\n  ".join(lines))


def check_config(config: dict) -> None:
    """Schema, then the cross-references: the chosen grid exists, cells name known models and
    datasets that can train, benchmarks are datasets of the right kind with a test split."""
    from softtokens.sources import loader_kind

    validate_schema(config)
    grid_name = config["grid"]
    if grid_name not in config["grids"]:
        raise ConfigError(f"'grid': {grid_name!r} is not one of grids: {', '.join(config['grids'])}")
    for name, grid in config["grids"].items():
        models, datasets = grid["models"], grid["datasets"]
        kinds = {d: loader_kind(s["loader"]) for d, s in datasets.items()}
        for d in datasets:
            if "-" in d:  # eval paths name a trained run '{dataset}-{mode}-seed{seed}'
                raise ConfigError(f"'grids.{name}.datasets.{d}': a dataset name cannot contain '-'")
            if d in ("base", "none"):  # 'base' names a base-only figure, 'none' the base in tables
                raise ConfigError(f"'grids.{name}.datasets.{d}': {d!r} is reserved, pick another dataset name")
        seen = set()
        for i, cell in enumerate(grid["training"]):
            where = f"'grids.{name}.training.{i}"
            if cell["model"] not in models:
                raise ConfigError(f"{where}.model': unknown model {cell['model']!r}")
            if cell["dataset"] not in datasets:
                raise ConfigError(f"{where}.dataset': unknown dataset {cell['dataset']!r}")
            kind, splits = kinds[cell["dataset"]]
            if kind != "math" or "train" not in splits:
                raise ConfigError(f"{where}.dataset': {cell['dataset']!r} has no training split to train on")
            if "validation_size" not in datasets[cell["dataset"]]:
                raise ConfigError(f"'grids.{name}.datasets.{cell['dataset']}': a training set needs validation_size")
            if (cell["model"], cell["dataset"]) in seen:
                raise ConfigError(f"{where}': ({cell['model']}, {cell['dataset']}) appears in two cells")
            seen.add((cell["model"], cell["dataset"]))
        ev = grid["evaluation"]
        for m in ev["models"]:
            if m not in models:
                raise ConfigError(f"'grids.{name}.evaluation.models': unknown model {m!r}")
        for key, want in (("benchmarks", "math"), ("ood_benchmarks", "multiple_choice")):
            for b in ev.get(key, []):
                if b not in datasets:
                    raise ConfigError(f"'grids.{name}.evaluation.{key}': unknown dataset {b!r}")
                kind, splits = kinds[b]
                if kind != want or "test" not in splits:
                    raise ConfigError(f"'grids.{name}.evaluation.{key}': {b!r} is not a {want} set with a test split")
        if any(m["source"] == "toy" for m in models.values()):
            if "toy_base" not in grid:
                raise ConfigError(f"'grids.{name}': a model with source 'toy' needs a 'toy_base' block")
            if not any(s["loader"] == "toy" for s in datasets.values()):
                raise ConfigError(f"'grids.{name}': a model with source 'toy' needs a dataset with loader 'toy'")


# the keys of `rl:` that say how a CoT is decoded; generation.cot_settings turns them into the
# six inference settings, the training rollout setting and the validation setting
COT_KEYS = ("hard_temperature", "soft_temperature", "fuzzy_temperature", "noise_factor")


def cell_rl(config: dict, grid_name: str, model: str, dataset: str) -> dict:
    """RL settings of one training cell: the paper's, the grid's overrides, the cell's overrides."""
    cells = [c for c in config["grids"][grid_name]["training"] if (c["model"], c["dataset"]) == (model, dataset)]
    return {**resolved_rl(config, grid_name), **(cells[0].get("rl", {}) if cells else {})}


def resolved_rl(config: dict, grid_name: str) -> dict:
    """The paper's RL hyper-parameters with the grid's overrides applied."""
    return {**config["rl"], **config["grids"][grid_name].get("rl", {})}


SLURM_ENV = {"partition": "SOFTTOKENS_SLURM_PARTITION", "gpu_partition": "SOFTTOKENS_SLURM_GPU_PARTITION",
             "account": "SOFTTOKENS_SLURM_ACCOUNT"}


def job_resources(grid: dict, kind: str, environ: dict | None = None) -> dict:
    """Resources of one kind of job from the grid's ``resources:`` block, plus the SLURM partition
    and account from the environment, so that nothing site-specific is in the repository. GPU
    jobs take SOFTTOKENS_SLURM_GPU_PARTITION, falling back to SOFTTOKENS_SLURM_PARTITION;
    an unset variable adds nothing (the plugin then uses the cluster's defaults), and
    ``--set-resources`` / ``--default-resources`` on the command line override all of it."""
    env = os.environ if environ is None else environ
    res = dict(grid.get("resources", {}).get(kind, {}))
    partition = (env.get(SLURM_ENV["gpu_partition"]) if res.get("gpu", 0) > 0 else None) or env.get(SLURM_ENV["partition"])
    if partition:
        res["slurm_partition"] = partition
    if env.get(SLURM_ENV["account"]):
        res["slurm_account"] = env[SLURM_ENV["account"]]
    return res


def load_config(path: str | Path) -> dict:
    config = yaml.safe_load(Path(path).read_text())
    check_config(config)
    return config
