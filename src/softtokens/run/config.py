"""config.yaml: schema validation with messages that name the offending key, cross-checks the
schema cannot express, and the resolved RL settings of a grid (the paper's + overrides).

The schema (config.schema.yaml, beside this module) is the one home of the paper's RL
hyper-parameters: each field's ``default``. Its enums of modes, settings and placements are
filled in from ``names`` when it is loaded, so a new mode or setting is added in one place."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path

import yaml

from softtokens.run import names

SCHEMA_PATH = Path(__file__).with_name("config.schema.yaml")


@functools.cache
def _schema() -> dict:
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    defs = schema["$defs"]
    defs["mode"]["enum"] = list(names.MODES)
    defs["setting"]["enum"] = list(names.SETTING_NAMES)
    defs["rl_fields"]["noise_placement"]["enum"] = list(names.PLACEMENTS)
    defs["evaluation"]["properties"]["ood_protocol"]["enum"] = list(names.OOD_PROTOCOLS)
    defs["ablation_table"]["properties"]["arms"]["items"]["pattern"] = f"^{names.ARM_RE}$"
    return schema


def load_schema() -> dict:
    """The config schema with its enums filled in from ``names`` (a copy: callers may change it)."""
    return copy.deepcopy(_schema())


def _paper_rl() -> dict:
    return {key: field["default"] for key, field in _schema()["$defs"]["rl_fields"].items()}


# The paper's RL hyper-parameters, from the schema's defaults
PAPER_RL: dict = _paper_rl()
# what an `evaluation:` block that does not say takes (batch sizes, seed, protocols)
EVAL_DEFAULTS: dict = {key: field["default"] for key, field in _schema()["$defs"]["evaluation"]["properties"].items()
                       if "default" in field}

# where a training run mirrors its telemetry (train.telemetry): the schema's `logging` defaults
LOGGING_DEFAULTS: dict = {key: field["default"] for key, field in _schema()["properties"]["logging"]["properties"].items()}


def resolved_logging(config: dict) -> dict:
    return {**LOGGING_DEFAULTS, **config.get("logging", {})}


class ConfigError(ValueError):
    """config.yaml is malformed; the message names the key."""


def _key_path(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def validate_schema(config: dict) -> None:
    import jsonschema

    schema = _schema()
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


# what a grid with `reuse: X` inherits from grid X (each may be overridden; `evaluation` and `rl`
# key by key); `training` and `ablation_tables` are the grid's own
INHERITED = ("results", "models", "datasets", "toy_base", "memory_plan", "resources", "rl", "evaluation")
MERGED = ("rl", "evaluation", "resources")


def resolve_grids(config: dict) -> dict:
    """``config`` with every ``reuse:`` grid completed from the grid it names, in place (and
    returned). Why: an ablation grid shares its base model, data, hyper-parameters and results
    directory with the grid whose default runs it reuses; copied by hand, one would drift and
    Snakemake would see changed parameters and retrain the reused runs."""
    grids = config.get("grids", {})
    for name, grid in grids.items():
        if not isinstance(grid, dict) or "reuse" not in grid:
            continue
        src_name = grid["reuse"]
        src = grids.get(src_name)
        if not isinstance(src, dict):
            raise ConfigError(f"'grids.{name}.reuse': {src_name!r} is not one of grids: {', '.join(grids)}")
        if "reuse" in src:
            raise ConfigError(f"'grids.{name}.reuse': {src_name!r} reuses another grid itself; name that one")
        for key in INHERITED:
            if key not in src:
                continue
            if key in MERGED and isinstance(grid.get(key), dict):
                grid[key] = {**src[key], **grid[key]}
            else:
                grid.setdefault(key, src[key])
    return config


def check_config(config: dict, loader_kind: Callable[[str], tuple[str, tuple[str, ...]]]) -> None:
    """Schema, then the cross-references: the chosen grid exists, cells name known models and
    datasets that can train, benchmarks are datasets of the right kind with a test split.
    ``loader_kind(loader) -> (kind, splits)`` is the data layer's (softtokens.data.sources):
    passed in, since this module sits below it."""
    resolve_grids(config)
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
            key = (cell["model"], cell["dataset"], cell.get("variant", ""))
            if key in seen:
                raise ConfigError(f"{where}': ({', '.join(filter(None, key))}) appears in two cells")
            seen.add(key)
            rl = cell_rl(config, name, cell["model"], cell["dataset"], cell.get("variant", ""))
            if rl.get("noise_top_k", 0) and rl.get("noise_placement") != "logits":
                raise ConfigError(f"{where}.rl.noise_top_k': top-k noise needs noise_placement: logits")
        for table, spec in grid.get("ablation_tables", {}).items():
            cells = {(c["model"], c["dataset"]) for c in grid["training"]}
            if len(cells) != 1:
                raise ConfigError(f"'grids.{name}.ablation_tables.{table}': ablation tables need the grid's "
                                  "training cells to share one (model, dataset)")
            arms = {f"{m}@{c['variant']}" for c in grid["training"] if c.get("variant") for m in c["modes"]}
            for a in spec["arms"]:
                if "@" in a and a not in arms:
                    raise ConfigError(f"'grids.{name}.ablation_tables.{table}.arms': {a!r} is no training cell's "
                                      f"mode@variant (have: {', '.join(sorted(arms))})")
                if "@" not in a and "reuse" not in grid and not any(
                        not c.get("variant") and a in c["modes"] for c in grid["training"]):
                    raise ConfigError(f"'grids.{name}.ablation_tables.{table}.arms': default arm {a!r} needs a "
                                      "default cell in this grid or a `reuse:` grid")
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


def cell_rl(config: dict, grid_name: str, model: str, dataset: str, variant: str = "") -> dict:
    """RL settings of one training cell: the paper's, the grid's overrides, the (model, dataset)
    default cell's overrides (in this grid, else in the grid it reuses), then the variant's.

    Why the default cell under a variant: an ablation differs from the run it ablates in exactly
    its own keys (gamma, tau, placement); everything else (CoT limit, micro-batch) is the default's."""
    grid = config["grids"][grid_name]

    def cell_overrides(g: dict, var: str) -> dict | None:
        cells = [c for c in g["training"] if (c["model"], c["dataset"], c.get("variant", "")) == (model, dataset, var)]
        return cells[0].get("rl", {}) if cells else None

    default = cell_overrides(grid, "")
    if default is None and "reuse" in grid:
        default = cell_overrides(config["grids"][grid["reuse"]], "")
    rl = {**resolved_rl(config, grid_name), **(default or {})}
    if variant:
        own = cell_overrides(grid, variant)
        if own is None:
            raise KeyError(f"grid {grid_name!r} has no cell ({model}, {dataset}, variant {variant!r})")
        rl.update(own)
    return rl


def resolved_rl(config: dict, grid_name: str) -> dict:
    """The paper's RL hyper-parameters with config.yaml's and then the grid's overrides applied."""
    return {**PAPER_RL, **config.get("rl", {}), **config["grids"][grid_name].get("rl", {})}


def load_config(path: str | Path, loader_kind) -> dict:
    config = yaml.safe_load(Path(path).read_text())
    check_config(config, loader_kind)
    return config
