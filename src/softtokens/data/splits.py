"""The splits of one configured dataset, as a prepare-data job writes them: the synthetic sets
made here, the real ones read through ``sources`` and held out / subsampled with their seed.

Why its own module: it is the one place that needs both the formats (``data``) and the source
readers (``sources``, which need ``data``); kept in ``data`` it made the two import each other.
"""

from __future__ import annotations

import random

from softtokens.data.rows import SPLITS
from softtokens.data.sources import check_generated_golds, load_split
from softtokens.data.toy import toy_choice_rows, toy_splits


def held_out(rows: list[dict], validation_size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, validation): a fixed seeded slice of the training rows, both in source order."""
    if validation_size >= len(rows):
        raise ValueError(f"validation_size {validation_size} leaves no training rows (the source has {len(rows)})")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    val = set(order[:validation_size])
    return [r for i, r in enumerate(rows) if i not in val], [r for i, r in enumerate(rows) if i in val]


def _subsample(rows: list[dict], size: int | None, seed: int) -> list[dict]:
    """A seeded subset of ``size`` rows in source order (all rows when size is None)."""
    if size is None or size >= len(rows):
        return rows
    keep = set(random.Random(seed).sample(range(len(rows)), size))
    return [r for i, r in enumerate(rows) if i in keep]


def prepare(name: str, settings: dict, splits: tuple[str, ...] = SPLITS) -> tuple[dict[str, list[dict]], dict]:
    """The requested splits of one configured dataset, and a report per source split that was
    read (where from, rows read, kept and dropped by reason) for the provenance record."""
    loader, seed = settings["loader"], settings.get("seed", 0)
    if loader == "toy":
        made = toy_splits(settings["train_size"], settings["validation_size"], settings["test_size"], seed)
        for split in splits:
            check_generated_golds(name, made[split])
        return {s: made[s] for s in splits}, {}
    if loader == "toy_mc":
        if set(splits) != {"test"}:
            raise ValueError(f"dataset {name!r}: a multiple-choice set has only a test split")
        return {"test": toy_choice_rows(settings["test_size"], seed)}, {}
    where = {"hub_id": settings.get("source"), "hf_config": settings.get("hf_config"), "path": settings.get("path"),
             "revision": settings.get("revision")}
    out, reports = {}, {}
    if {"train", "validation"} & set(splits):
        rows, report = load_split(name, loader, "train", **where)
        reports["train"] = report.as_dict()
        train, val = held_out(rows, settings.get("validation_size", 0), seed)
        out["train"], out["validation"] = _subsample(train, settings.get("train_size"), seed), val
    if "test" in splits:
        rows, report = load_split(name, loader, "test", **where)
        reports["test"] = report.as_dict()
        out["test"] = _subsample(rows, settings.get("test_size"), seed)
    for split, rows in out.items():
        if not rows:
            raise ValueError(f"dataset {name!r}: no usable rows in split {split!r} ({reports})")
    return {s: out[s] for s in splits}, reports
