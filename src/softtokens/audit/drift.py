"""A result against the config as it is now: the settings its job was given (its record's ``params_hash``) beside
the settings the current config gives that job. A table made before `rl: steps` was edited is still a whole chain
(every hash holds), but it is not what the config now asks for; the audit says so, naming the file and the job.

Which job makes a file is read off its path (store.paths' layout); which grid, off its results directory (every grid
sharing it: any of them may have made the file)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from softtokens.store import paths
from softtokens.store.provenance import config_hash


@lru_cache(maxsize=4)
def _config(path: str, signature: tuple) -> dict:
    from softtokens.data.sources import loader_kind
    from softtokens.config.grids import load_config

    return load_config(path, loader_kind)


def load(config_path: str | Path) -> dict | None:
    """The current config, checked as the workflow checks it (None: no config here to compare with)."""
    p = Path(config_path)
    if not p.is_file():
        return None
    st = p.stat()
    return _config(p.as_posix(), (st.st_size, st.st_mtime_ns))


def grid_jobs(config: dict, grid: str):
    from softtokens.grid.jobs import GridJobs
    from softtokens.sizing.plan import resolve_memory

    return GridJobs({**config, "grid": grid}, resolve_rl=resolve_memory)   # as the workflow gives each job


def wanted_settings(config: dict, path: Path) -> list[str]:
    """The settings hashes the current config gives the job that makes ``path``, one per grid sharing its results
    directory (empty: a file no job of this layout makes, or one the config no longer asks for)."""
    parts = path.as_posix().split("/")
    out = []
    for name, grid in config["grids"].items():
        results = grid.get("results", "") if isinstance(grid, dict) else ""
        if not results or not path.as_posix().startswith(results.rstrip("/") + "/"):
            continue
        rel = parts[len(results.rstrip("/").split("/")):]
        try:
            settings = _settings_of(grid_jobs(config, name), rel, path)
        except (KeyError, ValueError, IndexError):
            settings = None   # not a cell of this grid
        if settings is not None:
            out.append(config_hash(json.loads(settings)))
    return out


def _settings_of(jobs, rel: list[str], path: Path) -> str | None:
    kind = rel[0]
    if kind == "data":
        return jobs.dataset_settings(rel[1])
    if kind == "runs" and path.name == paths.METRICS:
        keys = paths.parse_run_path(path)
        return jobs.train_settings(keys["model"], keys["train_dataset"], rel[3], keys["seed"])
    if kind == "eval":
        keys = paths.parse_eval_path(path)
        trained = path.parent.parent.name
        return jobs.loglik_settings() if path.stem == "loglik" else jobs.eval_settings(keys["model"], trained)
    return None


def under_root(path: Path, root: Path | None) -> Path:
    """``path`` as the config names results: relative to the root the workflow ran in (a record's root)."""
    if root is None:
        return path
    try:
        return Path(path).absolute().relative_to(root.absolute())
    except ValueError:
        return path


def drift_problem(config: dict | None, path: Path, rec: dict, root: Path | None = None) -> str | None:
    """MADE UNDER ANOTHER CONFIG, where the settings its job was given are none the current config gives it."""
    made = rec.get("params_hash")
    if config is None or made is None:
        return None
    wanted = wanted_settings(config, under_root(path, root))
    if not wanted or made in wanted:
        return None
    return (f"MADE UNDER ANOTHER CONFIG {path}: its {rec.get('stage')} job was given settings {made}, the current "
            f"config gives it {wanted[0]} (remake it: snakemake -f {path})")
