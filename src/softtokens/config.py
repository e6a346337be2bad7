"""config.yaml: schema validation with messages that name the offending key, cross-checks the
schema cannot express, and the resolved RL settings of a grid (paper defaults + overrides)."""

from __future__ import annotations

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
    datasets, evaluation names known models and benchmarks."""
    validate_schema(config)
    grid_name = config["grid"]
    if grid_name not in config["grids"]:
        raise ConfigError(f"'grid': {grid_name!r} is not one of grids: {', '.join(config['grids'])}")
    for name, grid in config["grids"].items():
        models, datasets = grid["models"], grid["datasets"]
        for i, cell in enumerate(grid["training"]):
            if cell["model"] not in models:
                raise ConfigError(f"'grids.{name}.training.{i}.model': unknown model {cell['model']!r}")
            if cell["dataset"] not in datasets:
                raise ConfigError(f"'grids.{name}.training.{i}.dataset': unknown dataset {cell['dataset']!r}")
        ev = grid["evaluation"]
        for m in ev["models"]:
            if m not in models:
                raise ConfigError(f"'grids.{name}.evaluation.models': unknown model {m!r}")
        for b in ev["benchmarks"]:
            if b not in datasets:
                raise ConfigError(f"'grids.{name}.evaluation.benchmarks': unknown dataset {b!r}")
        if any(m["source"] == "toy" for m in models.values()) and "toy_base" not in grid:
            raise ConfigError(f"'grids.{name}': a model with source 'toy' needs a 'toy_base' block")


def resolved_rl(config: dict, grid_name: str) -> dict:
    """The paper's RL hyper-parameters with the grid's overrides applied."""
    return {**config["rl"], **config["grids"][grid_name].get("rl", {})}


def load_config(path: str | Path) -> dict:
    config = yaml.safe_load(Path(path).read_text())
    check_config(config)
    return config
