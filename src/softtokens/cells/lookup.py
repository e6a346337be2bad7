"""The cells every claim reads: an index by key, lookups, how a cell prints, and the entropy rows.

Why apart from judging: these are plain lookups over the cells (ours or the paper's), which the
claims, the report page and the simulation of reproductions all read; judging holds the rules.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from softtokens.cells.paper import CELL_KEYS
from softtokens.run.names import MODES

TRAINED = MODES


def index_cells(cells: pd.DataFrame | dict) -> dict:
    """The main (default-variant) cells by their key, each a plain dict of its columns (an index
    already made is returned as it is)."""
    if isinstance(cells, dict):
        return cells
    main = cells[cells.variant == ""] if "variant" in cells else cells.iloc[0:0]
    return {tuple(r[k] for k in CELL_KEYS): r for r in main.to_dict("records")}


def key_of(cell: dict) -> tuple:
    return tuple(cell[k] for k in CELL_KEYS)


def cell(idx, model, ds, mode, bench, setting, metric):
    return idx.get((model, ds, mode, "", bench, setting, metric))


def fmt(r) -> str:
    """mean ± std (n seeds, se): one seed or one evaluation has no spread, so no ±; the paper's cells
    print the std it printed."""
    n = 0 if pd.isna(r["n"]) else int(r["n"])
    std = r.get("shown_std", r["std"]) if hasattr(r, "get") else r["std"]
    sd = "" if pd.isna(std) or n < 2 else f"±{std:.2f}"
    se = "" if pd.isna(r["se"]) else f", se {r['se']:.2f}"
    return f"{r['mean']:.2f}{sd} (n={n}{se})"


def known(*cells) -> bool:
    return all(c is not None and not pd.isna(c["se"]) for c in cells)


def identical(a, b) -> bool:
    va, vb = a.get("values"), b.get("values")
    return va is not None and vb is not None and len(va) > 0 and tuple(va) == tuple(vb)


def passk_metric(cells: pd.DataFrame | dict) -> str | None:
    """The sampled metric with the largest k (the paper's pass@32; pass@n of a grid with n samples)."""
    metrics = {k[-1] for k in cells} if isinstance(cells, dict) else set(cells.metric)
    ks = [int(m.split("@")[1]) for m in metrics if m.startswith("pass@") and m != "pass@1"]
    return f"pass@{max(ks)}" if ks else None


def groups(idx, modes=TRAINED, metric_filter=lambda m: m.startswith("pass@")):
    """(model, training set, benchmark) of the trained cells whose metric passes the filter."""
    return sorted({(k[0], k[1], k[4]) for k in idx if k[2] in modes and metric_filter(k[6])})


def ood_groups(idx, metric):
    return sorted({(k[0], k[1], k[4]) for k in idx if k[2] in TRAINED and k[6] == metric})


def entropy_rows(eval_paths) -> pd.DataFrame:
    """Per math evaluation file: its mean CoT entropy over positions, weighted by the number of CoTs
    that reach each position (the profile the paper plots, reduced to one number)."""
    from softtokens.run.paths import parse_eval_path

    rows = []
    for p in map(Path, eval_paths):
        if p.stem == "loglik":
            continue
        res = json.loads(p.read_text())
        prof, count = res.get("entropy_profile"), res.get("entropy_count")
        if not prof or not count:
            continue
        total = sum(h * n for h, n in zip(prof, count) if h is not None)
        n = sum(c for h, c in zip(prof, count) if h is not None)
        if n:
            keys = parse_eval_path(p)
            if keys["variant"] == "":
                rows.append({**keys, "entropy": total / n})
    return pd.DataFrame(rows, columns=["model", "train_dataset", "train_mode", "variant", "benchmark", "setting",
                                       "seed", "entropy"])
