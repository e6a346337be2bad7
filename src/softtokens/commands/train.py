"""train (RLOO on one run, on one process or one per GPU), select (the checkpoint to test), plan
(every job's GPU memory) and config (what a grid resolves to)."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from softtokens.commands.common import (
    add_expect,
    check_expected,
    grid_config,
    parse_settings,
    record_base_model,
)

# set by torchrun / accelerate in each process they start: the job is already distributed
LAUNCHED = ("LOCAL_RANK", "RANK")


def launch_command(processes: int, argv: list[str], port: int) -> list[str]:
    """The command that runs ``softtokens <argv>`` once per GPU under accelerate (FSDP, one node)."""
    return ["accelerate", "launch", "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1",
            "--main_process_port", str(port), "--mixed_precision", "no", "--dynamo_backend", "no",
            "-m", "softtokens", *argv]


def free_port() -> int:
    """A free rendezvous port on this node: two multi-GPU jobs on one node would otherwise both
    take accelerate's default 29500."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def without_processes(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--processes":
            skip = True
        elif not arg.startswith("--processes="):
            out.append(arg)
    return out


def cmd_train(a) -> None:
    if a.processes > 1 and not any(k in os.environ for k in LAUNCHED):
        argv = without_processes(a.argv)
        cmd = launch_command(a.processes, argv, free_port())
        print("launching: " + " ".join(cmd), flush=True)
        os.execvp(cmd[0], cmd)
    from softtokens.data.rows import read_jsonl
    from softtokens.store.provenance import Provenance
    from softtokens.train.config import TrainConfig
    from softtokens.train.loop import Trainer

    s = parse_settings(a.settings)
    expected = check_expected(a.expect)
    cfg = TrainConfig.from_settings(s)
    from softtokens.store.provenance import made_by_workflow

    built = Path(a.base).exists() and made_by_workflow(a.base)   # a built base is an input; else a leaf (below)
    prov = Provenance("train", s, inputs={"train": a.train, "validation": a.validation,
                                          **({"base_model": a.base} if built else {})},
                      seeds={"seed": cfg.seed}, params=s)
    prov.expected = expected
    from softtokens.config.grids import LOGGING_DEFAULTS

    logging = None if a.tensorboard is None else {**LOGGING_DEFAULTS, **json.loads(a.logging or "{}")}
    # the job's CPUs shared by its processes (one per GPU): each its own part, none oversubscribed
    threads = max(1, a.threads // int(os.environ.get("WORLD_SIZE", "1")))
    trainer = Trainer(cfg, a.base, read_jsonl(a.train), read_jsonl(a.validation), Path(a.state_dir), threads,
                      logging=logging, run_name=Path(a.metrics).parent.as_posix())
    if trainer.dp.is_main:   # a local directory hashed beside the training; a hub id: the commit loaded
        record_base_model(prov, a.base, trainer.base_revision, background=True)
    trainer.run()
    attempts = trainer.attempts()
    trainer.finish(Path(a.checkpoints), Path(a.metrics), None if a.tensorboard is None else Path(a.tensorboard))
    if not trainer.dp.is_main:
        return  # the main process writes the outputs and their provenance
    extra = {"attempts": attempts, "embedding_scale": trainer.embedding_scale, "sigma": trainer.sigma,
             "noise": trainer.noise, "best_val": trainer.best_val, "base_val": trainer.base_val}
    prov.write_sidecar(a.metrics, extra=extra)
    from softtokens.model.checkpoint import manifest_sha256

    for name in ("best", "latest"):  # the directories' hashes from their manifests: no second read of the weights
        prov.write_sidecar(Path(a.checkpoints) / name, extra=extra, sha256=manifest_sha256(Path(a.checkpoints) / name))
    prov.write_sidecar(a.checkpoints, extra=extra, sha256=manifest_sha256(a.checkpoints, ("best", "latest")))


def cmd_select_shared(a) -> None:
    """A run that is another's name (grid.identity): its selection is the other run's, held to computing what this
    name asks for (train.selection.share_problem) before it is written."""
    from softtokens.audit.chain import SHARE_STAGE
    from softtokens.store.files import write_json
    from softtokens.commands.common import read_selection
    from softtokens.store.provenance import Provenance, rel
    from softtokens.train.selection import SHARED_WITH, share_problem

    settings = parse_settings(a.settings)
    chosen = read_selection(a.share)
    prov = Provenance(SHARE_STAGE, settings, inputs={"selected": a.share}, params=settings)
    doc = prov.embedded({**{k: v for k, v in chosen.items() if k != "provenance"},
                         SHARED_WITH: rel(Path(a.share).parent)}, a.out)
    write_json(a.out, doc)
    problem = share_problem(a.out)
    if problem:
        Path(a.out).unlink()
        raise SystemExit(f"error: {problem}")
    print(f"{Path(a.out).parent} is run {Path(a.share).parent} (the same settings): its selection shared")


def cmd_select(a) -> None:
    if a.share:
        return cmd_select_shared(a)
    from softtokens.audit.chain import SELECT_STAGE
    from softtokens.store.files import read_jsonl, write_json
    from softtokens.store.provenance import Provenance, rel
    from softtokens.train.selection import (
        FLOOR,
        CheckpointError,
        check_checkpoint,
        identity_problem,
        select_best,
        verify_checkpoint,
    )

    metrics = read_jsonl(Path(a.metrics))
    best_ckpt = Path(a.checkpoints) / "best"
    try:
        verify_checkpoint(best_ckpt, content=True)  # every byte, before an evaluation rests on it
    except CheckpointError as err:
        raise SystemExit(f"error: {err}") from None
    problem = identity_problem(best_ckpt, Path(a.metrics).parent)   # the run's own, not another's swapped in
    if problem:
        raise SystemExit(f"error: {problem}")
    prov = Provenance(SELECT_STAGE, {"rule": "max greedy validation accuracy over trained steps (>= 1), "
                                                    "earliest step on ties; step 0 (the base) is the reference",
                                            "failed_to_learn": f"below the base model's validation, or at or below "
                                                               f"{FLOOR:g}"},
                      inputs={"metrics": a.metrics, "checkpoints": a.checkpoints})
    chosen = select_best(metrics)
    try:
        check_checkpoint(best_ckpt, chosen["step"])
    except ValueError as err:
        raise SystemExit(f"error: {err}: the checkpoint is not the step this run's validation selects") from None
    write_json(a.out, prov.embedded({**chosen, "checkpoint": rel(best_ckpt)}, a.out))
    print(json.dumps(chosen))
    if chosen["failed_to_learn"]:
        print(f"WARNING: {Path(a.metrics).parent}: failed to learn: {chosen['failed_to_learn']}; its cells are "
              "marked in the tables and named in every verdict that rests on them", flush=True)


def cmd_plan_claims(a) -> None:
    """`plan --claims`: the cheapest grid that settles the claims (robustness.claim_plan)."""
    from softtokens.cells.paper import load_paper_results
    from softtokens.robustness.claim_plan import GRIDS_DIR, plan_claims, plan_json, plan_text, write_grid
    from softtokens.verdict.claims import MarginError

    config, _ = grid_config(a)
    keys = [k.strip() for k in a.claims.split(",") if k.strip()]
    try:
        result = plan_claims(keys, config, load_paper_results(), name=a.name, power=a.power, budget=a.budget)
    except (KeyError, MarginError) as err:
        raise SystemExit(err.args[0]) from None
    # the grid is written when asked (--write), or by the plain text form; --json alone writes nothing
    write = bool(result["kept"]) and (a.write is not None or not a.json)
    out = Path(a.write) if a.write else GRIDS_DIR / f"{result['name']}.yaml"
    if write:
        write_grid(result, out)
    if a.json:
        print(plan_json(result))
        return
    print(plan_text(result))
    if write:
        print(f"\nwrote {out}: snakemake --profile slurm --config grid={result['name']}  (-n first: the plan)")


def cmd_plan_trace(a) -> None:
    """The grid's plan held to its trace, phase by phase (gpucheck.trace_plan)."""
    import time

    from softtokens.gpucheck.trace_plan import DEPTHS, traced_plan
    from softtokens.sizing.trace_table import BAND, outside_band, trace_table
    from softtokens.store.files import write_text
    from softtokens.store.provenance import device

    config, grid = grid_config(a)
    jobs = [j.strip() for j in a.trace_jobs.split(",")] if a.trace_jobs else None
    start = time.perf_counter()
    records = traced_plan(config, grid, jobs=jobs, progress=lambda line: print(line, file=sys.stderr, flush=True))
    seconds = time.perf_counter() - start
    print(trace_table(records))
    out = Path(a.trace_out or f"benchmarks/results/memory_trace_{grid}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, json.dumps({"grid": grid, "depths": list(DEPTHS), "band": list(BAND), "device": device(),
                                "seconds": round(seconds, 1), "phases": records}, indent=1) + "\n")
    bad = outside_band(records)
    print(f"\n{len(records) - len(bad)} of {len(records)} phases within {BAND[0]}-{BAND[1]} of the plan; "
          f"traced in {seconds:.0f} s; {out}")
    if bad:
        raise SystemExit(1)


def cmd_plan(a) -> None:
    if getattr(a, "claims", None):
        return cmd_plan_claims(a)
    if getattr(a, "trace", False):
        return cmd_plan_trace(a)
    from softtokens.cost.forecast import forecast_text, load_throughput
    from softtokens.data.sources import loader_kind
    from softtokens.report.page import our_tables
    from softtokens.config.grids import load_config
    from softtokens.grid.memory import host_table
    from softtokens.sizing.plan import (
        DEFAULT_MARGIN,
        USABLE_SHARE,
        PlanError,
        check_plan,
        grid_plan,
        plan_budget,
        plan_table,
    )

    config, grid = grid_config(a)
    # the bill reads the grid as written: its levers recompute it under each gpus_per_run (`paper` included)
    written = load_config(a.config, loader_kind, grid)
    if a.json:   # one object: the bill (cost.bill), the GPUs and saves of a run, the rates and their files
        import json

        from softtokens.cost.bill import bill_json

        print(json.dumps(bill_json(written, grid, load_throughput(a.throughput)), indent=1))
        return
    memory_plan = config["grids"][grid].get("memory_plan", {})
    budget = plan_budget(config["grids"][grid])
    print(f"grid {grid}: GB (1e9 bytes) per GPU; " + (
        f"fits = every phase's peak <= {budget / 1e9:.1f} GB ({USABLE_SHARE:.0%} of {memory_plan['gpu_memory_gb']} GB "
        f"less the margin, memory_plan.margin {memory_plan.get('margin', DEFAULT_MARGIN):.0%} of the card)"
        if budget else "no GPU memory declared (not checked)"))
    print(plan_table(grid_plan(config, grid), budget))
    print(host_table(config, grid))
    benchmarks = config["grids"][grid]["evaluation"].get("benchmarks", [])
    from softtokens.cost.forecast import grid_gpus_per_node

    per_node = a.gpus_per_node or grid_gpus_per_node(config, grid)
    rates = load_throughput(a.throughput)
    print(forecast_text(config, grid, rates, a.nodes, per_node, our_tables(benchmarks)))
    if config["grids"][grid].get("memory_plan", {}).get("gpu_memory_gb"):   # a GPU grid: what it costs, by part
        from softtokens.cost.bill import bill_text

        print(bill_text(written, grid, rates))
    gpu_grid = config["grids"][grid].get("memory_plan", {}).get("gpu_memory_gb")
    if written["grids"][grid].get("sweep") and gpu_grid:   # the search: its runs, a cheaper reading, what it gives up
        from softtokens.cost.bill import sweep_text
        from softtokens.config.grids import read_config

        print(sweep_text(read_config(a.config, grid)[0], grid, rates, loader_kind))
    try:
        check_plan(config, grid)
    except PlanError as e:
        raise SystemExit(str(e)) from None


def cmd_config(a) -> None:
    """Each training cell's resolved RL settings, and what differs from the paper's."""
    import yaml

    from softtokens.config.grids import PAPER_RL, cell_rl
    from softtokens.config.readings import READINGS

    config, grid = grid_config(a)
    cells = {}
    for c in config["grids"][grid]["training"]:
        name = "/".join(filter(None, (c["model"], c["dataset"], c.get("variant"))))
        rl = cell_rl(config, grid, c["model"], c["dataset"], c.get("variant", ""))
        cells[name] = rl if a.full else {k: v for k, v in rl.items() if v != PAPER_RL[k]}
    print(f"# grid {grid}: RL settings per training cell" + ("" if a.full else ", where they differ from the paper's"))
    print(yaml.safe_dump(cells, sort_keys=False).rstrip())
    print("# readings of what the paper does not say (config.grids.READINGS), as this grid sets them:")
    for key, (why, alternative) in READINGS.items():
        values = sorted({str(cell_rl(config, grid, c["model"], c["dataset"], c.get("variant", ""))[key])
                         for c in config["grids"][grid]["training"]} or {str(PAPER_RL[key])})
        print(f"#   {key}: {', '.join(values)} -- {why}; the alternative, one setting away: {alternative}")


def register(sub) -> None:
    c = sub.add_parser("train", help="RLOO on one (model, dataset, mode, seed)")
    add_expect(c)
    for arg in ("--settings", "--base", "--train", "--validation", "--state-dir", "--checkpoints", "--metrics"):
        c.add_argument(arg, required=True)
    c.add_argument("--threads", type=int, default=1)
    c.add_argument("--tensorboard", default=None,
                   help="where the finished run's TensorBoard event files go (they stream into the resume state "
                        "while it trains); without it none are written")
    c.add_argument("--logging", default=None,
                   help="the config's `logging` block as JSON (wandb / trackio mirror, validation samples); "
                        "keys not given take the schema's defaults")
    c.add_argument("--processes", type=int, default=1,
                   help="FSDP processes, one per GPU: above 1 the command starts itself under `accelerate launch`")
    c.set_defaults(func=cmd_train)

    c = sub.add_parser("select", help="pick the best checkpoint by greedy validation")
    for arg in ("--metrics", "--checkpoints"):
        c.add_argument(arg)
    c.add_argument("--out", required=True)
    c.add_argument("--share", help="the selected.json of the run this one is (the same settings: grid.identity)")
    c.add_argument("--settings", help="with --share: this run's settings, held against the shared run's")
    c.set_defaults(func=cmd_select)

    for name, func, text in (("plan", cmd_plan, "per-GPU memory of every training and evaluation job of a grid"),
                             ("config", cmd_config, "each training cell's RL settings, as a grid resolves them")):
        c = sub.add_parser(name, help=text)
        c.add_argument("--config", default="config.yaml")
        c.add_argument("--grid", default=None, help="default: the config's `grid`")
        if name == "config":
            c.add_argument("--full", action="store_true", help="every setting, not only those off the paper's")
        else:
            c.add_argument("--throughput", default=None,
                           help="a gpu-check report (JSON) whose measured rates the cost forecast uses; default: "
                                "the H100 one in benchmarks/results/ (cost.forecast.DEFAULT)")
            c.add_argument("--nodes", type=int, default=1, help="nodes the wall-clock forecast assumes")
            c.add_argument("--gpus-per-node", type=int, default=None,
                           help="default: the most GPUs one job of the grid asks for (a node must hold it)")
            c.add_argument("--claims", default=None, metavar="KEY[,KEY...]",
                           help="the cheapest grid that settles these claims of the paper (robustness.claim_plan): "
                                "their verdicts' odds, the seeds that settle each, the grid (written to grids/) "
                                "and its cost")
            c.add_argument("--power", type=float, default=0.8,
                           help="with --claims: the probability of a decided verdict that settles a claim")
            c.add_argument("--budget", type=float, default=None, metavar="GPU_HOURS",
                           help="with --claims: keep the claims that fit, best first")
            c.add_argument("--json", action="store_true",
                           help="one JSON object: the grid's bill (GPU-hours by model x phase, the GPUs and saves "
                                "of a run, the rates and the files they come from, the paper's budget, the choices "
                                "that move it); with --claims the claims' plan (the correlation, margins and draws "
                                "used, each claim's odds and cells, the grid and its forecast), writing no grid "
                                "unless --write")
            c.add_argument("--trace", action="store_true",
                           help="every phase of every training and evaluation job run through the project's own code "
                                "under PyTorch's fake tensors with torch's memory tracker (gpucheck.trace), beside the "
                                "plan: a table | job | phase | planned GB | traced GB | traced / planned |, written as "
                                "JSON (--trace-out); exits 1 if a ratio is outside 0.95-1.05")
            c.add_argument("--trace-out", default=None, metavar="PATH",
                           help="with --trace: the JSON record (default: benchmarks/results/memory_trace_GRID.json)")
            c.add_argument("--trace-jobs", default=None, metavar="JOB[,JOB...]",
                           help="with --trace: only these jobs (as the table names them, e.g. 'train llama-3b/math')")
            c.add_argument("--name", default=None, help="with --claims: the grid's name (default: from the claims)")
            c.add_argument("--write", default=None, metavar="PATH",
                           help="with --claims: write the grid to PATH (without --json it is written to "
                                "grids/NAME.yaml anyway)")
        c.set_defaults(func=func)
