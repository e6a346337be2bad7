"""The provenance chain of a result, as the records the jobs wrote hold it: every file the result rests on (by its
path relative to the workflow's root), the jobs that made them, and the leaves they read from outside the workflow.
What a crate is made of (crate.build), from the records alone: no second source of truth.

A job is told from another by its record's identity (its stage, settings, host and start), so the files one job wrote
(a table's md, tex, csv, html and cells.json) are one action with several results."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from softtokens.store import paths
from softtokens.store.provenance import at_root, own_path, read_record, record_root

MODEL_FILE = "model.safetensors"   # a directory holding one is a model: a checkpoint, a base (crate: by hash only)


@dataclass
class Job:
    stage: str
    record: dict
    results: list[str] = field(default_factory=list)   # root-relative paths it wrote
    inputs: list[str] = field(default_factory=list)    # root-relative paths it read (job outputs)


@dataclass
class Chain:
    root: Path                                          # the workflow's root: what every record's paths are under
    files: dict[str, dict] = field(default_factory=dict)   # root-relative path -> its record
    jobs: dict[tuple, Job] = field(default_factory=dict)
    leaves: dict[str, dict] = field(default_factory=dict)  # a leaf's key -> what the records say of it
    shipped: set[str] = field(default_factory=set)          # files the package ships (the paper's numbers)


def job_key(rec: dict) -> tuple:
    return (rec.get("stage"), rec.get("config_hash"), rec.get("params_hash"), rec.get("host"), rec.get("started"))


def is_model(path: Path) -> bool:
    """A directory of weights (a checkpoint or a base model): referenced by its hash unless asked for whole."""
    return path.is_dir() and (any(path.glob(MODEL_FILE)) or any(path.glob(f"*/{MODEL_FILE}")))


def _relative(root: Path, path: Path) -> str:
    try:
        return Path(path).absolute().relative_to(root.absolute()).as_posix()
    except ValueError:
        return Path(path).absolute().as_posix()


def chain_of(targets: list[Path]) -> Chain:
    """The chain of every target (a file or directory a job made), walked through the records' inputs."""
    import softtokens

    package = Path(softtokens.__file__).resolve().parent
    chain: Chain | None = None
    queue, seen = [Path(t) for t in targets], set()
    while queue:
        path = queue.pop()
        key = path.absolute().as_posix()
        if key in seen:
            continue
        seen.add(key)
        if package in path.resolve().parents:
            if chain is not None:
                chain.shipped.add(_relative(chain.root, path))
            continue
        rec = read_record(path)
        if rec is None:
            raise ValueError(f"{path}: no provenance record: not a result a job of this workflow made")
        root = record_root(path, rec)
        if root is None:
            raise ValueError(f"{path}: not where its job wrote it ({own_path(rec)}): a crate is made of a tree as "
                             "its jobs left it")
        chain = chain or Chain(root=root)
        rel = _relative(chain.root, path)
        chain.files[rel] = rec
        job = chain.jobs.setdefault(job_key(rec), Job(rec.get("stage", "?"), rec))
        if rel not in job.results:
            job.results.append(rel)
        for other in rec.get("outputs") or []:
            queue.append(at_root(root, other))
        for inp in (rec.get("inputs") or {}).values():
            p = at_root(root, inp["path"])
            rel_in = _relative(chain.root, p)
            if rel_in not in job.inputs:
                job.inputs.append(rel_in)
            queue.append(p)
        for name, leaf in (rec.get("external_inputs") or {}).items():
            if isinstance(leaf, dict):
                chain.leaves[leaf_id(leaf, name)] = leaf
    if chain is None:
        raise ValueError("nothing to put in a crate: no target")
    return chain


def leaf_id(leaf: dict, name: str) -> str:
    """A leaf's identifier in the crate: a hub id at its revision, a packaged file, a local path."""
    if leaf.get("kind") == "hub":
        return leaf.get("ref") or f"https://huggingface.co/{leaf.get('id')}" + (
            f"/tree/{leaf['revision']}" if leaf.get("revision") else "")
    return leaf.get("path") or f"#leaf-{name}"


def grid_targets(results: Path) -> list[Path]:
    """A grid's summaries: every table, figure and report file under its results directory that a job made."""
    out = []
    for sub in ("tables", "figures", "report"):
        for p in sorted((Path(results) / sub).glob("*")):
            if p.is_file() and not p.name.endswith(".prov.json") and read_record(p) is not None:
                out.append(p)
    return out


def target_files(target: Path) -> list[Path]:
    """What `softtokens crate TARGET` packs: a table (any of its files: all of them), a figure, the report, or a
    grid's results directory (every summary in it)."""
    target = Path(target)
    if target.is_dir() and (target / "tables").is_dir():
        return grid_targets(target)
    if target.name.endswith(paths.CELLS_EXT) or target.suffix in (".md", ".csv", ".tex", ".html", ".png", ".pdf",
                                                                   ".json"):
        return [target]
    raise ValueError(f"{target}: give a table, a figure, the report or a grid's results directory")
