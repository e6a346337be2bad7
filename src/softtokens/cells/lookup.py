"""The cells every claim reads: an index by key, lookups, how a cell prints, and the entropy rows.

Why apart from judging: these are plain lookups over the cells (ours or the paper's), which the
claims, the report page and the simulation of reproductions all read; judging holds the rules.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from softtokens.cells.paper import CELL_KEYS
from softtokens.config.names import MODES

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


NO_CELL = "no cell"                      # a comparison's cell that this set of numbers does not have
NO_SPREAD_ONE_SEED = "no spread: one seed"
NO_SPREAD = "no spread: none printed"


def absent(key: tuple) -> dict:
    """A cell a plan reads that these numbers lack: its key, no value, and why (``missing``)."""
    return {**dict(zip(CELL_KEYS, key)), "mean": float("nan"), "std": float("nan"), "n": 0, "se": float("nan"),
            "sampling_var": float("nan"), "values": None, "seeds": None, "questions": None, "missing": NO_CELL}


def cell(idx, model, ds, mode, bench, setting, metric):
    """The cell of these keys, or an ``absent`` one saying it is not there (a plan names what it lacks)."""
    key = (model, ds, mode, "", bench, setting, metric)
    return idx.get(key) or absent(key)


def gap(*cells) -> str | None:
    """Why a comparison of these cells cannot be made (None: it can): a cell not there, a placeholder
    for one a paper-numbers file lacks, or a cell with no spread (one seed; a blank ±). Such a
    comparison is never dropped: it counts as undecided (verdict.judging)."""
    for c in cells:
        if c is None:
            return NO_CELL
        reason = c.get("missing") if hasattr(c, "get") else None
        if isinstance(reason, str) and reason:
            return reason
    for c in cells:
        if pd.isna(c["se"]):
            return NO_SPREAD_ONE_SEED if not pd.isna(c["n"]) and int(c["n"]) == 1 else NO_SPREAD
    return None


def fmt(r) -> str:
    """mean ± std (n seeds, se): one seed or one evaluation has no spread, so no ±; the paper's cells
    print the std it printed; a cell that is not there says why."""
    reason = r.get("missing") if hasattr(r, "get") else None
    if isinstance(reason, str) and reason:
        return f"({reason})"
    n = 0 if pd.isna(r["n"]) else int(r["n"])
    std = r.get("shown_std", r["std"]) if hasattr(r, "get") else r["std"]
    sd = "" if pd.isna(std) or n < 2 else f"±{std:.2f}"
    se = "" if pd.isna(r["se"]) else f", se {r['se']:.2f}"
    return f"{r['mean']:.2f}{sd} (n={n}{se})"


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
    from softtokens.store.paths import parse_eval_path

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


ENTROPY_METRIC = "log_entropy"   # the entropy claim's statistic: log of a file's mean CoT entropy


def entropy_cells(entropy: pd.DataFrame | None) -> dict:
    """Cells of the entropy claim from per-file mean CoT entropies (entropy_rows): per model, training,
    benchmark and setting, the log of each seed's entropy averaged over seeds, its sample std, the
    per-seed values (a contrast of one run's cells is paired by seed); no test-set term (the files keep
    no per-question entropies: stated by the claim). A difference of two is a log ratio."""
    import math

    if entropy is None or entropy.empty:
        return {}
    out = {}
    keys = ["model", "train_dataset", "train_mode", "variant", "benchmark", "setting"]
    for key, sub in entropy[entropy.entropy > 0].sort_values("seed").groupby(keys, sort=False):
        values = tuple(math.log(v) for v in sub.entropy)
        n = len(values)
        base = key[2] == "none"
        mean = sum(values) / n
        std = 0.0 if base else (math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else float("nan"))
        full = (*key, ENTROPY_METRIC)
        out[full] = {**dict(zip(CELL_KEYS, full)), "mean": mean, "std": std, "n": 1 if base else n,
                     "sampling_var": 0.0, "se": 0.0 if base else (std / math.sqrt(n) if n > 1 else float("nan")),
                     "values": None if base else values, "seeds": None if base else tuple(sub.seed),
                     "questions": None, "failed_seeds": ()}
    return out
