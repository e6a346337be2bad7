"""Where fuzzy training's gradient spikes come from, and what clipping them does (issue 14).

Reads a grid's training metrics (each step's gradient norm before clipping, `near_ties` and
`jacobian_max`: the CoT steps whose mixture's top two weights are within 1 % and the largest
p1 p2 / tau, rloo._chunk_terms) and its evaluation files, and writes:
  - spikes.json: per arm, how often a step's norm exceeds SPIKE x the median of the previous 50
    steps, and how that goes with near ties;
  - curves.md: greedy validation mean +- std over seeds at every validation step, and the test
    pass@1 of each arm's evaluations (hard greedy, and the arm's own greedy setting);
  - spikes.png: gradient norm and greedy validation of every soft / fuzzy run, spikes marked.
Usage: python analysis/fuzzy_spikes.py [RESULTS_DIR=results/toy-long] [MODEL=toy] [DATASET=toyarith]
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

SPIKE = 10.0      # a spike: a norm above SPIKE x the median of the previous WINDOW steps with a gradient
WINDOW = 50
TIE_JACOBIAN = 10.0  # a step "has a near tie" when its largest p1 p2 / tau exceeds this (spike_sources: cutting
# the Jacobian above 10 removes a spike, above 100 does not)


def read_runs(results: Path, model: str, dataset: str) -> dict[str, dict[int, list[dict]]]:
    runs: dict[str, dict[int, list[dict]]] = defaultdict(dict)
    for metrics in sorted((results / "runs" / model / dataset).glob("*/seed*/metrics.jsonl")):
        arm, seed = metrics.parent.parent.name, int(metrics.parent.name.removeprefix("seed"))
        runs[arm][seed] = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return runs


def spike_steps(train: list[dict], factor: float = SPIKE) -> list[int]:
    """Indices of steps whose norm exceeds factor x the median of the previous WINDOW nonzero norms."""
    out, past = [], []
    for i, m in enumerate(train):
        if len(past) >= 5 and m["grad_norm"] > factor * statistics.median(past[-WINDOW:]):
            out.append(i)
        if m["grad_norm"] > 0:
            past.append(m["grad_norm"])
    return out


def spike_stats(seeds: dict[int, list[dict]]) -> dict:
    steps = spikes = tie_steps = tie_spikes = 0
    ratios, collapse = [], []
    for rows in seeds.values():
        train = [m for m in rows if m["kind"] == "train"]
        val = {m["step"]: m["val_greedy_accuracy"] for m in rows if m["kind"] == "validation"}
        found = set(spike_steps(train))
        norms = [m["grad_norm"] for m in train if m["grad_norm"] > 0]
        ratios.append(max(norms) / statistics.median(norms))
        for i, m in enumerate(train):
            tie = m.get("jacobian_max", 0.0) > TIE_JACOBIAN
            steps += 1
            tie_steps += tie
            spikes += i in found
            tie_spikes += tie and i in found
        for i in found:  # greedy validation before and after the spike (the nearest validations)
            before = max((s for s in val if s <= train[i]["step"]), default=None)
            after = min((s for s in val if s > train[i]["step"] + 5), default=None)
            if before is not None and after is not None:
                collapse.append(val[after] - val[before])
    return {"runs": len(seeds), "steps": steps, "spikes": spikes, "spikes_per_100_steps": 100 * spikes / max(1, steps),
            "steps_with_a_near_tie": tie_steps, "spikes_at_a_near_tie": tie_spikes,
            "spike_rate_at_a_near_tie": tie_spikes / tie_steps if tie_steps else None,
            "spike_rate_without": (spikes - tie_spikes) / (steps - tie_steps) if steps > tie_steps else None,
            "max_over_median_norm": [round(r, 1) for r in ratios],
            "validation_change_across_a_spike": [round(c, 4) for c in collapse],
            "clipped_steps": sum(m.get("clipped", False) for rows in seeds.values() for m in rows if m["kind"] == "train")}


def mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.1f}±{100 * sd:.1f}"


def curves_table(runs: dict[str, dict[int, list[dict]]], results: Path, model: str, dataset: str) -> str:
    val_steps = sorted({m["step"] for seeds in runs.values() for rows in seeds.values() for m in rows
                        if m["kind"] == "validation"})
    head = ["arm", "seeds"] + [str(s) for s in val_steps] + ["best step", "test hard greedy", "test own greedy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = results / "eval" / model / "base" / dataset
    for arm, seeds in sorted(runs.items(), key=lambda kv: (kv[0].split("@")[0] != "hard", kv[0])):
        mode = arm.split("@")[0]
        cells = []
        for s in val_steps:
            vals = [m["val_greedy_accuracy"] for rows in seeds.values() for m in rows
                    if m["kind"] == "validation" and m["step"] == s]
            cells.append(mean_sd(vals))
        tests = {}
        for setting in ("hard_greedy", f"{mode}_greedy"):
            vals = []
            for seed in seeds:
                f = results / "eval" / model / f"{dataset}-{arm}-seed{seed}" / dataset / f"{setting}.json"
                if f.exists():
                    vals.append(json.loads(f.read_text())["pass@1"])
            tests[setting] = mean_sd(vals)
        best = []
        for seed in seeds:
            f = results / "runs" / model / dataset / arm / f"seed{seed}" / "selected.json"
            if f.exists():
                best.append(str(json.loads(f.read_text()).get("step")))
        lines.append("| " + " | ".join([arm, str(len(seeds)), *cells, ", ".join(best) or "-",
                                         tests["hard_greedy"], tests[f"{mode}_greedy"]]) + " |")
    for setting in ("hard_greedy",):
        f = base / f"{setting}.json"
        if f.exists():
            lines.append(f"\nbase model, test {setting} pass@1: {100 * json.loads(f.read_text())['pass@1']:.1f}")
    return "\n".join(lines)


def plot(runs: dict[str, dict[int, list[dict]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a in sorted(runs) if not a.startswith("hard")]
    fig, axes = plt.subplots(2, len(arms), figsize=(4.2 * len(arms), 6.5), sharex=True, sharey="row", squeeze=False)
    for j, arm in enumerate(arms):
        for seed, rows in sorted(runs[arm].items()):
            color = f"C{seed}"  # one colour per seed in every panel
            train = [m for m in rows if m["kind"] == "train"]
            live = [m for m in train if m["grad_norm"] > 0]  # steps whose rewards all tied have no gradient
            axes[0, j].semilogy([m["step"] for m in live], [m["grad_norm"] for m in live], lw=0.7, color=color,
                                label=f"seed {seed}")
            clip = [m for m in train if m.get("grad_clip")]
            if clip:
                axes[0, j].plot([m["step"] for m in clip], [m["grad_clip"] for m in clip], ls="--", lw=0.8,
                                color=color, alpha=0.7)
            sp = spike_steps(train)
            axes[0, j].scatter([train[i]["step"] for i in sp], [train[i]["grad_norm"] for i in sp], marker="x",
                               color=color, s=25, zorder=3)
            val = [m for m in rows if m["kind"] == "validation"]
            axes[1, j].plot([m["step"] for m in val], [100 * m["val_greedy_accuracy"] for m in val], marker="o",
                            ms=3, color=color, label=f"seed {seed}")
            for i in sp:
                axes[1, j].axvline(train[i]["step"], color=color, lw=0.5, alpha=0.5)
        axes[0, j].set_title(arm)
        axes[1, j].set_xlabel("training step")
        axes[1, j].set_ylim(0, 100)
    axes[0, 0].set_ylabel("gradient norm (before clipping)")
    axes[1, 0].set_ylabel("greedy validation (%)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"Gradient norm before clipping (x: spikes, > {SPIKE:g}x the running median; dashed: the clip bound) "
                 "and greedy validation (vertical lines: spikes)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str]) -> None:
    results = Path(argv[0]) if argv else Path("results/toy-long")
    model = argv[1] if len(argv) > 1 else "toy"
    dataset = argv[2] if len(argv) > 2 else "toyarith"
    runs = read_runs(results, model, dataset)
    if not runs:
        raise SystemExit(f"no runs under {results / 'runs' / model / dataset}")
    out = results / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    stats = {arm: spike_stats(seeds) for arm, seeds in sorted(runs.items())}
    (out / "spikes.json").write_text(json.dumps(stats, indent=1))
    table = curves_table(runs, results, model, dataset)
    (out / "curves.md").write_text(table + "\n")
    plot(runs, out / "spikes.png")
    print(json.dumps(stats, indent=1))
    print(table)
    print(f"wrote {out}/spikes.json, curves.md, spikes.png")


if __name__ == "__main__":
    main(sys.argv[1:])
