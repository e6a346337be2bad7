"""config.yaml: schema validation with messages that name the offending key, cross-checks the
schema cannot express, and the resolved RL settings of a grid (the paper's + overrides).

The schema (config.schema.yaml, beside this module) is the one home of the paper's RL
hyper-parameters: each field's ``default``. Its enums of modes, settings and placements are
filled in from ``names`` when it is loaded, so a new mode or setting is added in one place."""

from __future__ import annotations

import copy
import difflib
import functools
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml

from softtokens.config import names
from softtokens.config.text import ConfigError, check_yaml_syntax, key_lines, key_path, unknown_name
from softtokens.config.sweeps import SWEPT, expand_sweeps, spec_of

SCHEMA_PATH = Path(__file__).with_name("config.schema.yaml")


@functools.cache
def _schema() -> dict:
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    defs = schema["$defs"]
    defs["mode"]["enum"] = list(names.MODES)
    defs["setting"]["enum"] = list(names.SETTING_NAMES)
    defs["evaluation"]["properties"]["settings"]["default"] = list(names.SETTING_NAMES)
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


# the keys that say where a real dataset is read from (a generated one, data.toy, reads none)
SOURCE_KEYS = ("path", "source", "hf_config", "revision")


# a number YAML 1.1 (PyYAML, Snakemake's loader) reads as text: an exponent without a dot, '3e-4'
_YAML11_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _set(config: dict, path, value) -> None:
    node = config
    for k in list(path)[:-1]:
        node = node[k]
    node[list(path)[-1]] = value


def _coerce_yaml11_numbers(config: dict, validator) -> list[str]:
    """Numbers written the way YAML 1.1 reads as text ('3e-4') where the schema wants a number, turned
    into numbers (what was meant); the paths changed."""
    changed = []
    for e in validator.iter_errors(config):
        wants = e.schema.get("type") if e.validator == "type" else None
        if wants in ("number", ["number"]) and isinstance(e.instance, str) and _YAML11_NUMBER.match(e.instance.strip()):
            _set(config, e.absolute_path, float(e.instance))
            changed.append(key_path(e.absolute_path))
    return changed


def validate_schema(config: dict, config_files: Iterable[str | Path] = ()) -> None:
    """The config against its schema. A number YAML 1.1 reads as text ('3e-4') is taken as the number
    it spells; every other problem is reported once (a key a reusing grid inherits is not repeated
    per grid), with its file and line when ``config_files`` are given, and a close known key."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(_schema())
    _coerce_yaml11_numbers(config, validator)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if not errors:
        return
    lines_of = key_lines(config_files)

    def where(path: tuple) -> str:
        at = lines_of.get(tuple(path))
        return f" ({at})" if at else ""

    # problem -> every path it shows at: a block a reusing grid inherits is the same object, so one
    # problem shows once per grid; it is reported once, where it is written
    problems: dict[tuple, list[tuple]] = {}
    texts: dict[tuple, Callable[[tuple], str]] = {}
    for e in errors:
        path = tuple(e.absolute_path)
        if e.validator == "additionalProperties":
            known = sorted(e.schema.get("properties", {}))
            extra = sorted(set(e.instance) - set(known)) if isinstance(e.instance, dict) else []
            for key in extra:
                token = (id(e.instance), "unknown", key)
                problems.setdefault(token, []).append(path + (key,))
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else (f" (known keys: {', '.join(known)})" if known else "")
                texts[token] = lambda full, hint=hint: f"unknown key '{key_path(full)}'{where(full)}{hint}"
        else:
            # a block by its identity; a value by its message and key (a merged `rl:` copies values)
            token = (id(e.instance) if isinstance(e.instance, (dict, list)) else path[-2:], e.validator, e.message)
            problems.setdefault(token, []).append(path)
            note = (" (write numbers with a dot before the exponent: 3.0e-4, not 3e-4)"
                    if e.validator == "type" and isinstance(e.instance, str) and "number" in str(e.schema.get("type"))
                    else "")
            if e.validator == "enum":   # a misspelled mode or setting: the closest one
                close = difflib.get_close_matches(str(e.instance), [str(v) for v in e.validator_value], n=1, cutoff=0.5)
                note = f"; did you mean {close[0]!r}?" if close else ""
            texts[token] = lambda full, msg=e.message, note=note: f"'{key_path(full)}'{where(full)}: {msg}{note}"
    def own(path: tuple) -> bool:  # not a grid that inherits the block through `reuse:`
        grids = config.get("grids") if isinstance(config.get("grids"), dict) else {}
        return not (len(path) > 1 and path[0] == "grids" and isinstance(grids.get(path[1]), dict)
                    and "reuse" in grids[path[1]])

    lines = []
    for token, found in problems.items():
        best = [f for f in found if f in lines_of] or [f for f in found if own(f)] or found
        lines.append(texts[token](best[0]))
    raise ConfigError("invalid config.yaml:\n  " + "\n  ".join(lines))


# what a grid with `reuse: X` inherits from grid X (each may be overridden; `evaluation` and `rl`
# key by key); `training`, `sweep` and `ablation_tables` are the grid's own
INHERITED = ("results", "models", "gpus_per_run", "datasets", "toy_base", "memory_plan", "resources", "rl",
             "evaluation")
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


def check_config(config: dict, loader_kind: Callable,
                 config_files: Iterable[str | Path] = ()) -> None:
    """Schema, then the cross-references: the chosen grid exists, cells name known models and
    datasets that can train, benchmarks are datasets of the right kind with a test split, a
    generated (toy) dataset names no hub or local source. ``loader_kind(loader) -> (kind, splits,
    generated)`` is the data layer's (softtokens.data.sources): passed in, since this module sits below it.
    ``config_files``: where the config was read from, for the line of a bad key."""
    resolve_grids(config)
    validate_schema(config, config_files)
    lines = key_lines(config_files)
    check_sweeps(config, lines)
    expand_sweeps(config, resolved_rl)   # a sweep's runs become training cells, checked below as any other
    grid_name = config["grid"]
    if grid_name not in config["grids"]:
        raise unknown_name("grid", grid_name, config["grids"], "grid", lines)

    def other_grids(dataset: str, name: str) -> str:
        found = [g for g, spec in config["grids"].items() if g != name and dataset in spec.get("datasets", {})]
        return (f"; {dataset!r} is a dataset of grid {found[0]}: add it to this grid's datasets, or select that grid"
                if found else "")
    for name, grid in config["grids"].items():
        models, datasets = grid["models"], grid["datasets"]
        kinds = {}
        for d, spec in datasets.items():
            try:
                kinds[d] = loader_kind(spec["loader"])
            except KeyError as err:  # the data layer's registry of loaders is the one list
                raise ConfigError(f"'grids.{name}.datasets.{d}.loader': {err.args[0]}") from None
        for d in datasets:
            if "-" in d:  # eval paths name a trained run '{dataset}-{mode}-seed{seed}'
                raise ConfigError(f"'grids.{name}.datasets.{d}': a dataset name cannot contain '-'")
            if d in ("base", "none"):  # 'base' names a base-only figure, 'none' the base in tables
                raise ConfigError(f"'grids.{name}.datasets.{d}': {d!r} is reserved, pick another dataset name")
            if kinds[d].generated:
                unread = [k for k in SOURCE_KEYS if k in datasets[d]]
                if unread:
                    raise ConfigError(f"'grids.{name}.datasets.{d}.{unread[0]}': loader {datasets[d]['loader']!r} "
                                      f"generates its rows; {', '.join(unread)} would not be read (remove it)")
        seen = set()
        for i, cell in enumerate(grid["training"]):
            where = f"'grids.{name}.training.{i}"
            if cell["model"] not in models:
                raise unknown_name("model", cell["model"], models, f"grids.{name}.training.{i}.model", lines)
            if cell["dataset"] not in datasets:
                raise unknown_name("dataset", cell["dataset"], datasets, f"grids.{name}.training.{i}.dataset", lines,
                                   other_grids(cell["dataset"], name))
            kind, splits, _ = kinds[cell["dataset"]]
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
        for j, m in enumerate(ev["models"]):
            if m not in models:
                raise unknown_name("model", m, models, f"grids.{name}.evaluation.models.{j}", lines)
        for key, want in (("benchmarks", "math"), ("ood_benchmarks", "multiple_choice")):
            for j, b in enumerate(ev.get(key, [])):
                if b not in datasets:
                    raise unknown_name("dataset", b, datasets, f"grids.{name}.evaluation.{key}.{j}", lines,
                                       other_grids(b, name))
                kind, splits, _ = kinds[b]
                if kind != want or "test" not in splits:
                    raise ConfigError(f"'grids.{name}.evaluation.{key}': {b!r} is not a {want} set with a test split")
        if any(m["source"] == "toy" for m in models.values()):
            if "toy_base" not in grid:
                raise ConfigError(f"'grids.{name}': a model with source 'toy' needs a 'toy_base' block")
            if not any(s["loader"] == "toy" for s in datasets.values()):
                raise ConfigError(f"'grids.{name}': a model with source 'toy' needs a dataset with loader 'toy'")


def check_sweeps(config: dict, lines: dict) -> None:
    """Each sweep's pairs name models and datasets the grid has, and every swept parameter has its pairs
    and seeds (its own or the sweep's)."""
    for name, grid in config["grids"].items():
        sweep = grid.get("sweep") or {}
        for param in (p for p in SWEPT if p in sweep):
            spec = spec_of(sweep, param)
            for key in ("pairs", "seeds"):
                if key not in spec:
                    raise ConfigError(f"'grids.{name}.sweep.{param}': no {key} (give them here or for the whole sweep)")
            where = f"grids.{name}.sweep.{param if 'pairs' in sweep[param] else ''}".rstrip(".")
            for i, (model, dataset) in enumerate(spec["pairs"]):
                if model not in grid["models"]:
                    raise unknown_name("model", model, grid["models"], f"{where}.pairs.{i}", lines)
                if dataset not in grid["datasets"]:
                    raise unknown_name("dataset", dataset, grid["datasets"], f"{where}.pairs.{i}", lines)


def cell_lr(config: dict, grid_name: str, model: str, dataset: str, variant: str = "") -> float:
    """A training cell's learning rate: its own ``lr`` (a sweep's variant), else its model's."""
    grid = config["grids"][grid_name]
    for c in grid["training"]:
        if (c["model"], c["dataset"], c.get("variant", "")) == (model, dataset, variant) and "lr" in c:
            return float(c["lr"])
    return float(grid["models"][model]["lr"])


def cell_grid(config: dict, grid_name: str, model: str, dataset: str, variant: str = "") -> str:
    """The grid that names a run of ``grid_name``'s results: ``grid_name`` for its own cells (and default runs),
    else the first grid sharing its results whose cells do (a run another grid's name is trained under that grid's
    settings: grid.identity)."""
    grids = config["grids"]

    def names(g: str) -> bool:
        return any((c["model"], c["dataset"], c.get("variant", "")) == (model, dataset, variant)
                   for c in grids[g].get("training", []))

    if not variant or names(grid_name):
        return grid_name
    results = grids[grid_name]["results"]
    return next((g for g, spec in grids.items() if isinstance(spec, dict) and spec.get("results") == results
                 and names(g)), grid_name)


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


GRIDS_DIR = "grids"   # beside config.yaml: a grid of its own per file, grids/NAME.yaml


def grid_files(root: str | Path, config: dict) -> list[Path]:
    """The grid files a config selects: grids/NAME.yaml of the selected grid when config.yaml has no
    such grid, and of the grid it reuses, likewise. Why only these: a file generated for one grid
    (`plan --claims`) must not change, or break, the config of another."""
    out, name = [], config.get("grid")
    grids = dict(config.get("grids") or {})
    while name and name not in grids:
        f = Path(root) / GRIDS_DIR / f"{name}.yaml"
        if not f.is_file() or f in out:
            break
        out.append(f)
        check_yaml_syntax(f)
        grids.update((yaml.safe_load(f.read_text()) or {}).get("grids") or {})
        name = (grids.get(name) or {}).get("reuse")
    return out


def read_config(path: str | Path, grid: str | None = None) -> tuple[dict, list[Path]]:
    """config.yaml with the grid files of the grid it (or ``grid``) selects (grid_files), unchecked,
    and the files it was read from, in the order they apply."""
    check_yaml_syntax(path)
    config = yaml.safe_load(Path(path).read_text())
    if grid:
        config["grid"] = grid
    files = grid_files(Path(path).parent, config)
    for f in files:
        config.setdefault("grids", {}).update(yaml.safe_load(f.read_text())["grids"])
    return config, [Path(path), *files]


def load_config(path: str | Path, loader_kind, grid: str | None = None) -> dict:
    """read_config, checked (check_config)."""
    config, files = read_config(path, grid)
    check_config(config, loader_kind, files)
    return config


# ---------------------------------------------------------------- what a run's settings compute
MEMORY_ONLY = ("micro_batch_size", "activation_checkpointing", "val_batch_size")
NAME_ONLY = ("variant",)


def computing_settings(settings: dict) -> dict:
    """A run's settings less its name and what changes only memory: what decides its numbers."""
    return {k: v for k, v in settings.items() if k not in MEMORY_ONLY + NAME_ONLY}


def train_processes(grid: dict, model: str) -> int:
    """GPUs (one process each) of a model's training jobs: the model's ``train_gpus``, else the
    grid's ``resources.train.gpu``, else 1."""
    spec = grid["models"][model]
    return int(spec.get("train_gpus") or grid.get("resources", {}).get("train", {}).get("gpu") or 1)
