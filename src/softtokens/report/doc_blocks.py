"""Numbers in the docs that the code can compute: written between markers by `softtokens docs --write`,
held equal to the code by `softtokens docs` (and tests/test_docs.py).

Why: a number typed into a page drifts from the code that makes it (a job count, a verdict on the
paper's numbers). A block is the text between

    <!-- generated: NAME (softtokens docs --write) -->
    ...
    <!-- end generated: NAME -->

in a file of the repository; its text is BLOCKS[NAME]() and nothing else.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from softtokens.report.doc_verdicts import (
    degrees_of_freedom_block,
    judging_choices_block,
    paper_claims_block,
    paper_findings_block,
    specifications_block,
)

BEGIN = "<!-- generated: {name} (softtokens docs --write) -->"
END = "<!-- end generated: {name} -->"


def dry_run_counts(root: Path, *args: str) -> dict[str, int]:
    """Jobs per rule of a Snakemake dry run at ``root`` (the real DAG: its counts are not re-derived here)."""
    snakemake = Path(sys.executable).parent / "snakemake"
    proc = subprocess.run([str(snakemake), *args, "-n", "--quiet", "rules"], cwd=root, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"snakemake {' '.join(args)} -n failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
    counts = {}
    for line in (proc.stdout + proc.stderr).split("Job stats:")[-1].splitlines():
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if m:
            counts[m.group(1)] = int(m.group(2))
    return counts


def paper_plan_block(root: Path) -> str:
    """What `snakemake --profile slurm -n` plans for the paper grid, rule by rule, from the dry run, with
    what each rule's jobs are, from the grid (grid.jobs)."""
    import pandas as pd
    import yaml

    from softtokens.data.sources import loader_kind
    from softtokens.config.grids import check_config
    from softtokens.grid.jobs import GridJobs

    config = yaml.safe_load((root / "config.yaml").read_text())
    config["grid"] = "paper"
    check_config(config, loader_kind)
    jobs = GridJobs(config)
    runs = jobs.training_runs()
    cells = sorted({(r.model, r.dataset) for r in runs})
    modes, seeds = sorted({r.mode for r in runs}), sorted({r.seed for r in runs})
    trained = {d for _, d in cells}
    models = len(jobs.evaluated_models())
    bench, ood = jobs.eval["benchmarks"], jobs.ood
    what = {
        "prepare_data": f"training sets ({', '.join(sorted(trained))}): train + a held-out validation slice",
        "prepare_benchmark": f"test sets: {', '.join(bench + ood)}",
        "train": f"Table 1's cells: {', '.join(f'{m} × {d}' for m, d in cells)}; × {{{', '.join(modes)}}} × seeds "
                 f"{{{', '.join(map(str, seeds))}}}",
        "select_checkpoint": "best greedy-validation step (≥ 1) of each run",
        "evaluate": f"{models} models ({len(runs)} selected + {models - len(runs)} base) × {{{', '.join(bench)}}} × "
                    f"{len(jobs.eval['settings'])} inference settings (n = {jobs.eval['n_samples']})",
        "evaluate_loglik": f"{models} models × {{{', '.join(ood)}}}",
        "main_table": "Table 1: hard inference on every math benchmark",
        "settings_table": "one per benchmark: every inference setting (the appendix tables)",
        "ood_table": "the out-of-domain table",
        "training_figure": "training curves per (model, training set)",
        "passk_figure": "pass@k per (model, training set, benchmark)",
        "entropy_figure": "CoT entropy per (model, training set, benchmark)",
        "reproduction_report": "the claims, every paper cell beside ours, the cost ledger",
        "all": "",
    }
    counts = dry_run_counts(root, "--profile", "slurm")
    order = {rule: i for i, rule in enumerate(what)}  # the DAG's stages, whatever order Snakemake lists them in
    rules = sorted((r for r in counts if r != "total"), key=lambda r: (order.get(r, len(order)), r))
    rows = [{"job": f"`{rule}`", "count": counts[rule], "what": what.get(rule, "")} for rule in rules]
    rows.append({"job": "total", "count": counts["total"], "what": ""})
    return pd.DataFrame(rows).to_markdown(index=False)


def paper_memory_plan_block(root: Path) -> str:
    """`softtokens plan --grid paper`'s memory table (sizing.plan: architecture numbers, `auto` resolved)."""
    import yaml

    from softtokens.data.sources import loader_kind
    from softtokens.config.grids import check_config
    from softtokens.sizing.gpus import resolve_gpus
    from softtokens.sizing.plan import grid_plan, plan_budget, plan_table

    config = yaml.safe_load((root / "config.yaml").read_text())
    check_config(config, loader_kind)
    resolve_gpus(config, "paper")   # the GPUs `gpus_per_run: auto` gives each model, as the workflow does
    return plan_table(grid_plan(config, "paper"), plan_budget(config["grids"]["paper"]))


def memory_trace_block(root: Path) -> str:
    """The committed trace of the paper grid (`softtokens plan --grid paper --trace`), its table as the command
    prints it, with the host it ran on."""
    from softtokens.sizing.trace_table import trace_table

    record = json.loads((root / "benchmarks/results/memory_trace_paper.json").read_text())
    dev = record["device"]
    return (trace_table(record["phases"]) + f"\n\nTraced on a {dev.get('count', '?')}-core {dev.get('name', 'CPU')} "
            f"in {record['seconds']:.0f} s, depths {', '.join(map(str, record['depths']))} extrapolated to each model's.")


def mini_forecast_block(root: Path) -> str:
    """What `softtokens plan --grid mini` forecasts (cost.forecast, at the shipped rates)."""
    import yaml

    from softtokens.cost.forecast import forecast_jobs
    from softtokens.data.sources import loader_kind
    from softtokens.config.grids import check_config

    config = yaml.safe_load((root / "config.yaml").read_text())
    check_config(config, loader_kind)
    jobs = forecast_jobs(config, "mini")
    train = jobs.gpu_hours[jobs.rule == "train"].sum()
    return (f"`plan` forecasts {jobs.gpu_hours.sum():.1f} GPU-hours for it (training {train:.1f}, evaluation "
            f"{jobs.gpu_hours.sum() - train:.1f}; `tests/test_forecast.py` holds it under 24).")


def _hosts(root: Path, name: str) -> list[dict]:
    """The measurements of one timing file, a host kind each (benchmarks/fresh_clone_time.py), the latest first."""
    import json

    doc = json.loads((root / name).read_text())
    return sorted(doc["hosts"].values(), key=lambda m: (m["date"], m["commit"]), reverse=True)


def _toy_parameters(root: Path) -> str:
    import yaml

    from softtokens.sizing.plan import toy_architecture

    toy = yaml.safe_load((root / "config.yaml").read_text())["grids"]["toy"]["toy_base"]
    return f"{toy_architecture(toy).parameters / 1e6:.2g}M"


def demo_time_block(root: Path) -> str:
    """The demo's time as last measured on each kind of host (benchmarks/results/demo_time.json: a fresh clone,
    set-up included), each named."""
    lines = [f"- `make demo` runs the `toy` grid (a {_toy_parameters(root)}-parameter Llama and synthetic addition word "
             f"problems\n  that the workflow makes itself) end to end, then Snakemake's HTML report, set-up included, "
             f"when last measured:"]
    # what a measurement's `how` adds after its method (another demo than today's, say) is said beside it
    lines += [f"  - {m['seconds'] / 60:.1f} minutes on {m['host']} ({m['date']}, {m['commit']}"
              f"{'; ' + m['how'].split('; ', 1)[1] if '; ' in m.get('how', '') else ''})" for m in _hosts(root, DEMO_TIME)]
    return "\n".join(lines) + "\n  Dated timings and what moved them: [docs/findings.md](docs/findings.md)."


def demo_results_block(root: Path) -> str:
    """What the toy's tables said when the demo was last measured (demo_time.json's tables), dated and named by host:
    a sentence about results is the results', never fixed prose that another host's floats can contradict."""
    latest = next((m for m in _hosts(root, DEMO_TIME) if m.get("tables")), None)
    if latest is None:
        return "The demo's numbers have not been recorded with its timing yet (benchmarks/fresh_clone_time.py)."

    def rows(table: str, columns: tuple[str, ...]) -> str:
        out = []
        for r in latest["tables"].get(table, []):
            values = ", ".join(f"{c.split(' ', 1)[1] if ' ' in c else c} {r[c]}" for c in columns if c in r)
            out.append(f"{r['training']}: {values}")
        return "; ".join(out)

    main = latest["tables"].get("main", [])
    greedy = next((c for c in (main[0] if main else {}) if c.endswith("Greedy pass@1")), None)
    ood = latest["tables"].get("ood", [])
    acc = next((c for c in (ood[0] if ood else {}) if c.endswith("Accuracy")), None)
    seeds = max((int(r["seeds"]) for r in main if str(r.get("seeds", "")).isdigit()), default=1)
    spread = f"mean ± std over {seeds} seeds" if seeds > 1 else "one seed per trained model: no ±"
    return (f"When last measured ({latest['date']}, {latest['commit']}, {latest['host']}), the demo's tables read "
            f"({spread}): greedy pass@1 on the toy's test set, {rows('main', (greedy,))}; out-of-domain "
            f"accuracy, {rows('ood', (acc,))}. Runs marked † failed to learn (their best trained step validated below "
            f"the base). Another host's floats give other numbers (docs/findings.md); "
            f"`results/toy/report/reproduction.html` says what this run's numbers show.")


DEMO_TIME = "benchmarks/results/demo_time.json"
TEST_TIME = "benchmarks/results/test_time.json"


def test_time_block(root: Path) -> str:
    """The suite's time as last measured on each kind of host, and its split by kind of test (the latest:
    benchmarks/results/test_time.json, written by benchmarks/fresh_clone_time.py: a fresh clone, set-up included).
    A measurement from before the two tiers (no ``tier``) was of the whole suite, and says so."""
    hosts = _hosts(root, TEST_TIME)
    m = hosts[0]
    split = ", ".join(f"{kind} {seconds / 60:.1f}" for kind, seconds in m["kinds"].items())

    def when(h: dict) -> str:
        what = f"{h['passed']} passed, {h['skipped']} skipped" if h.get("tier") else \
            f"the whole suite, before the tiers: {h['passed']} passed"
        return f"{h['seconds'] / 60:.1f} minutes on {h['host']} ({h['date']}, {h['commit']}, {what})"

    slow = [f"{h['slow']['seconds'] / 60:.1f} minutes on {h['host']} ({h['slow']['date']}, {h['slow']['commit']}, "
            f"{h['slow']['passed']} passed, {h['slow']['skipped']} skipped)" for h in hosts if h.get("slow")]
    return (f"- `make test` runs the suite's first tier (every test not marked slow) on three pytest-xdist workers,\n"
            f"  set-up included, when last measured: {'; '.join(when(h) for h in hosts)}.\n"
            f"  By kind, in worker-minutes on the first (workers run side by side, so these add up to more): {split}.\n"
            f"  Unit: the package's functions, the paper's precision, the memory plan against its committed trace; DAG:\n"
            f"  a real `snakemake` on the tiny grid (end to end once, read by the integrity attacks and their honest\n"
            f"  twins), one kill of the whole run and its bit-identical rerun, dry runs of the first day's mistakes.\n"
            f"- `make test-slow` runs the second tier (tests marked slow, tens of seconds to minutes each on a 2-core host): the real\n"
            f"  model (SmolLM2-135M from the shipped package through hard, soft and fuzzy training, the six settings,\n"
            f"  tables and the audit), the tiny grid through a real one-node SLURM (skipped, saying why, where SLURM\n"
            f"  cannot start), FSDP on CPU over two and four processes, the memory trace of the paper's jobs, every\n"
            f"  fault, kill and damage scenario beyond the first of each kind, and the dry runs of every paper grid"
            + (f"; when last measured, after `make test` in the same clone: {'; '.join(slow)}" if slow else "")
            + ".\n  CI (`.ci/run`) runs both; `make test-all` runs both at once, `make test TEST_WORKERS=0` in one "
              "process,\n  `pytest tests/test_x.py` one file (both tiers).")


def datasets_block(root: Path) -> str:
    """Every dataset loader (data.sources.SOURCES): its hub source, the splits we make of it, how the gold
    answer is read; a loader added there appears here."""
    import pandas as pd

    from softtokens.data.sources import SOURCES

    def splits(src) -> str:
        out = []
        for ours, theirs in src.splits.items():
            name = theirs if theirs == ours else f"its `{theirs}` split"
            if ours == "train":
                size = f" ({src.train_size:,})" if src.train_size else ""
                out.append(f"train{size} → train + a seeded validation slice")
            else:
                size = f" ({src.test_size:,})" if src.test_size else ""
                out.append(f"test{size}" + ("" if theirs == ours else f", from {name}"))
        return "; ".join(out)

    rows = [{"dataset": f"`{name}`", "source": f"`{src.hub_id}`" + (f" `{src.hf_config}`" if src.hf_config else "")
             + (f" ({src.notes})" if src.notes else ""), "kind": src.kind.replace("_", " "), "our splits": splits(src),
             "gold answer": src.gold} for name, src in SOURCES.items()]
    return pd.DataFrame(rows).to_markdown(index=False)


def claims_budget_block(root: Path) -> str:
    """The worked example of `softtokens plan --claims` (robustness.claim_plan) on the shipped config."""
    import yaml

    from softtokens.cells.paper import load_paper_results
    from softtokens.data.sources import loader_kind
    from softtokens.config.grids import check_config
    from softtokens.robustness.claim_plan import plan_claims, plan_text

    config = yaml.safe_load((root / "config.yaml").read_text())
    check_config(config, loader_kind)
    result = plan_claims(["passk_advantage", "ood_nll_lower_than_hard", "pass1_parity"], config, load_paper_results(),
                         name="claims-example", budget=1500.0)
    return "```\n$ softtokens plan --claims passk_advantage,ood_nll_lower_than_hard,pass1_parity --budget 1500\n" \
        + plan_text(result) + "\n```"


BLOCKS: dict[str, Callable[[Path], str]] = {
    "paper-claims": paper_claims_block,
    "paper-findings": paper_findings_block,
    "judging-choices": judging_choices_block,
    "paper-plan": paper_plan_block,
    "paper-memory-plan": paper_memory_plan_block,
    "memory-trace": memory_trace_block,
    "datasets": datasets_block,
    "claims-budget": claims_budget_block,
    "degrees-of-freedom": degrees_of_freedom_block,
    "mini-forecast": mini_forecast_block,
    "demo-time": demo_time_block,
    "demo-results": demo_results_block,
    "test-time": test_time_block,
    "specifications": specifications_block,
}

# which files hold which blocks (paths from the repository root)
FILES: dict[str, tuple[str, ...]] = {
    "docs/protocol.md": ("paper-claims", "paper-findings", "judging-choices", "claims-budget", "degrees-of-freedom",
                         "specifications"),
    "docs/cluster.md": ("paper-plan", "mini-forecast"),
    "README.md": ("demo-time", "test-time", "demo-results"),
    "docs/memory-plan.md": ("paper-memory-plan", "memory-trace"),
    "docs/data-and-reward.md": ("datasets",),
}


def _pattern(name: str) -> re.Pattern:
    return re.compile(re.escape(BEGIN.format(name=name)) + r"\n(.*?)\n?" + re.escape(END.format(name=name)), re.S)


# a block's text per (name, code root) for the life of the process: the code and config do not change
# under a running `softtokens docs` (a dry run and a thousand simulations are not redone per file)
_COMPUTED: dict[tuple[str, str], str] = {}


def block_text(name: str, root: Path) -> str:
    key = (name, str(Path(root).resolve()))
    if key not in _COMPUTED:
        _COMPUTED[key] = BLOCKS[name](root).rstrip("\n")
    return _COMPUTED[key]


def render(text: str, name: str, root: Path) -> str:
    """``text`` with block ``name`` rewritten; a file without the block's markers is an error."""
    pattern = _pattern(name)
    if not pattern.search(text):
        raise KeyError(f"no markers for the generated block {name!r} ({BEGIN.format(name=name)})")
    body = block_text(name, root)
    return pattern.sub(lambda _: f"{BEGIN.format(name=name)}\n{body}\n{END.format(name=name)}", text, count=1)


def stale(root: Path, code_root: Path | None = None) -> list[str]:
    """Every (file, block) under ``root`` whose text is not what the code (at ``code_root``, default
    ``root``) gives now, as 'file: block' lines."""
    out = []
    for rel, names in FILES.items():
        path = root / rel
        text = path.read_text()
        for name in names:
            try:
                if render(text, name, code_root or root) != text:
                    out.append(f"{rel}: {name}")
            except KeyError as err:
                out.append(f"{rel}: {err.args[0]}")
    return out


def write(root: Path, code_root: Path | None = None) -> list[str]:
    """Rewrite every block in place; the files changed."""
    changed = []
    for rel, names in FILES.items():
        path = root / rel
        text = new = path.read_text()
        for name in names:
            new = render(new, name, code_root or root)
        if new != text:
            path.write_text(new)
            changed.append(rel)
    return changed
