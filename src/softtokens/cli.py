"""`python -m softtokens <command>`: the one entry point every Snakemake rule calls.

Each command takes the resolved settings of its DAG node as JSON (``--settings``), explicit
input and output paths, writes its outputs atomically, and stamps them with provenance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def check_expected(expected) -> dict:
    from softtokens.provenance import StaleInput, check_expected as check

    try:
        return check(expected or [])
    except StaleInput as err:
        raise SystemExit(f"stale input: {err}") from None


def _settings(text: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"--settings is not valid JSON: {e}") from None


# ---------------------------------------------------------------- commands
def cmd_prepare_data(a) -> None:
    from softtokens.splits import prepare
    from softtokens.provenance import Provenance, write_jsonl

    s = _settings(a.settings)
    splits = tuple(a.splits.split(","))
    prov = Provenance("prepare_data", {**s, "splits": list(splits)}, seeds={"seed": s.get("seed")}, params=s)
    prepared, reports = prepare(a.dataset, s, splits)
    for split, report in reports.items():
        if report["local_path"]:  # a local copy: hashed (a file, or every file of a directory)
            prov.add_input(f"source_{split}", report["local_path"])
        else:
            prov.add_external(f"source_{split}", report["reference"])
    out = Path(a.out_dir)
    for split, rows in prepared.items():
        path = out / f"{split}.jsonl"
        write_jsonl(path, rows)
        prov.write_sidecar(path, extra={"rows": len(rows), "split": split, "source_reports": reports})
    for split, report in reports.items():
        dropped = ", ".join(f"{n} {why}" for why, n in report["dropped"].items()) or "none"
        print(f"{a.dataset} {split}: read {report['read']} rows from {report['reference']}, kept {report['kept']}, "
              f"dropped {sum(report['dropped'].values())} ({dropped})")
    print(json.dumps({k: len(v) for k, v in prepared.items()}))


def cmd_build_toy_base(a) -> None:
    from softtokens.data import read_jsonl
    from softtokens.provenance import Provenance, atomic_dir, write_json
    from softtokens.toybase import build_toy_base
    from softtokens.training import greedy_accuracy
    from softtokens.generation import CotEngine, INFERENCE_SETTINGS

    s = _settings(a.settings)
    expected = check_expected(a.expect)
    prov = Provenance("build_toy_base", s, inputs={"train": a.train, "validation": a.validation},
                      seeds={"seed": s["seed"]}, params=s)
    prov.expected = expected
    train, val = read_jsonl(a.train), read_jsonl(a.validation)
    keys = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size", "sft_steps",
            "sft_batch_size", "sft_lr", "seed", "forget_carry_rate")
    model, tok, log = build_toy_base(train, **{k: s[k] for k in keys if k in s}, threads=a.threads)
    acc = greedy_accuracy(CotEngine(model, tok), val, INFERENCE_SETTINGS["hard_greedy"], s["cot_max_tokens"],
                          s["answer_max_tokens"])
    with atomic_dir(a.out) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_json(tmp / "sft_log.json", {"log": log, "val_greedy_accuracy": acc,
                                          "parameters": sum(p.numel() for p in model.parameters())})
    prov.write_sidecar(a.out, extra={"val_greedy_accuracy": acc})
    print(f"toy base: {sum(p.numel() for p in model.parameters())} parameters, validation greedy accuracy {acc:.3f}")


def cmd_train(a) -> None:
    from softtokens.data import read_jsonl
    from softtokens.provenance import Provenance
    from softtokens.training import TrainConfig, Trainer

    s = _settings(a.settings)
    expected = check_expected(a.expect)
    cfg = TrainConfig.from_settings(s)
    base_is_path = Path(a.base).exists()
    prov = Provenance("train", s, inputs={"train": a.train, "validation": a.validation,
                                          **({"base_model": a.base} if base_is_path else {})},
                      seeds={"seed": cfg.seed}, params=s)
    prov.expected = expected
    trainer = Trainer(cfg, a.base, read_jsonl(a.train), read_jsonl(a.validation), Path(a.state_dir), a.threads)
    if not base_is_path:  # a hub id: record the commit whose weights were loaded
        prov.add_external("base_model", f"{a.base}@{trainer.base_revision or 'unknown revision'}")
    trainer.run()
    attempts = trainer.attempts()
    trainer.finish(Path(a.checkpoints), Path(a.metrics))
    if not trainer.dp.is_main:
        return  # the main process writes the outputs and their provenance
    extra = {"attempts": attempts, "embedding_scale": trainer.embedding_scale, "sigma": trainer.sigma,
             "noise": trainer.noise,
             "best_val": trainer.best_val,
             "base_val": trainer.base_val}
    prov.write_sidecar(a.metrics, extra=extra)
    for name in ("best", "latest"):
        prov.write_sidecar(Path(a.checkpoints) / name, extra=extra)
    prov.write_sidecar(a.checkpoints, extra=extra)


def cmd_select(a) -> None:
    from softtokens.provenance import Provenance, write_json
    from softtokens.selection import check_checkpoint, select_best

    metrics = [json.loads(x) for x in Path(a.metrics).read_text().splitlines() if x.strip()]
    best_ckpt = Path(a.checkpoints) / "best"
    prov = Provenance("select_checkpoint", {"rule": "max greedy validation accuracy over trained steps (>= 1), "
                                                    "earliest step on ties; step 0 (the base) is the reference"},
                      inputs={"metrics": a.metrics, "checkpoints": a.checkpoints})
    chosen = select_best(metrics)
    check_checkpoint(best_ckpt, chosen["step"])
    write_json(a.out, {**chosen, "checkpoint": best_ckpt.as_posix(), "provenance": prov.record()})
    print(json.dumps(chosen))


def cmd_evaluate(a) -> None:
    from softtokens.data import read_jsonl
    from softtokens.evaluation import evaluate
    from softtokens.config import COT_KEYS
    from softtokens.generation import placement_of
    from softtokens.provenance import Provenance, write_json
    from softtokens.rewards import GRADING_TIMEOUT_S

    s = _settings(a.settings)
    if len(a.setting) != len(a.out):
        raise SystemExit(f"evaluate: {len(a.setting)} --setting but {len(a.out)} --out; give one output per setting")
    model_path, inputs = _model_to_evaluate(a)
    expected = check_expected(a.expect)
    cot = {k: s[k] for k in COT_KEYS if k in s} or None  # the grid's (or the run's) CoT settings
    rows = read_jsonl(a.data)
    # several settings in one process (evaluation.one_job_per_setting: false) pay the start-up once;
    # each file is what its own job would have written
    for setting, out in zip(a.setting, a.out):
        prov = Provenance("evaluate", {**s, "setting": setting}, inputs={**inputs, "data": a.data},
                          seeds={"seed": s.get("seed", 0)}, params=s)
        prov.expected = expected
        result = evaluate(model_path, rows, setting, s["n_samples"], s["cot_max_tokens"],
                          s["answer_max_tokens"], s.get("batch_size", 64), s.get("seed", 0), s.get("dtype", "float32"),
                          a.threads, s.get("grading_timeout_s", GRADING_TIMEOUT_S), cot=cot, placement=placement_of(s))
        if not inputs:
            prov.add_external("base_model", f"{model_path}@{result['model_revision'] or 'unknown revision'}")
        write_json(out, {**result, **_selection_record(a), "provenance": prov.record()})
        print(f"{setting}: pass@1 {result['pass@1']:.3f}, pass@{result['n_samples']} "
              f"{result['pass@k'][str(result['n_samples'])]:.3f}, grading time-outs {result['grading_timeouts']} "
              f"({result['seconds']} s); sigma {result['sigma']:.4g}, set by {result['sigma_source']}", flush=True)


def cmd_plan(a) -> None:
    from softtokens.config import load_config
    from softtokens.plan import USABLE_SHARE, PlanError, check_plan, grid_plan, plan_table

    config = load_config(a.config)
    grid = a.grid or config["grid"]
    if grid not in config["grids"]:
        raise SystemExit(f"no grid {grid!r} in {a.config} (grids: {', '.join(config['grids'])})")
    gpu_gb = config["grids"][grid].get("memory_plan", {}).get("gpu_memory_gb")
    print(f"grid {grid}: GB (1e9 bytes) per GPU; "
          + (f"fits = peak <= {USABLE_SHARE:.0%} of {gpu_gb} GB" if gpu_gb else "no GPU memory declared (not checked)"))
    print(plan_table(grid_plan(config, grid), gpu_gb))
    try:
        check_plan(config, grid)
    except PlanError as e:
        raise SystemExit(str(e)) from None


def cmd_gpu_check(a) -> int:
    from softtokens.config import load_config
    from softtokens.gpucheck import SECTIONS, run_gpu_check

    sections = tuple(a.sections.split(",")) if a.sections else SECTIONS
    modes = tuple(a.modes.split(","))
    report = run_gpu_check(Path(a.out), load_config(a.config), smoke=a.smoke, sections=sections, modes=modes,
                           steps=a.steps, repeats=a.repeats, work_dir=a.work_dir, eval_cot=a.eval_cot,
                           device=a.device)
    print(report.summary())
    print(f"wrote {Path(a.out) / 'gpu_check.json'} and gpu_check.md")
    return 0 if report.passed else 1


def _selection_record(a) -> dict:
    """Which checkpoint of a trained run produced a result, and how it compared with its base on
    validation (tables mark runs selected below their base); nothing for a base model."""
    if not a.selected:
        return {}
    chosen = json.loads(Path(a.selected).read_text())
    return {"selection": {k: chosen.get(k) for k in ("step", "val_greedy_accuracy", "base_val_greedy_accuracy",
                                                      "improved_over_base")}}


def _model_to_evaluate(a) -> tuple[str, dict]:
    """The model path and the provenance inputs of a --model / --selected pair of arguments; a
    selected checkpoint is verified against what its training wrote before anything loads it."""
    if a.selected:
        from softtokens.selection import CheckpointError, verify_checkpoint

        model_path = json.loads(Path(a.selected).read_text())["checkpoint"]
        try:
            verify_checkpoint(model_path)
        except CheckpointError as err:
            raise SystemExit(f"error: {err}") from None
        return model_path, {"selected": a.selected, "checkpoint": model_path}
    return a.model, ({"base_model": a.model} if Path(a.model).exists() else {})


def cmd_evaluate_loglik(a) -> None:
    from softtokens.data import read_jsonl
    from softtokens.ood import DEFAULT_PROTOCOL, evaluate_ood
    from softtokens.provenance import Provenance, write_json

    s = _settings(a.settings)
    model_path, inputs = _model_to_evaluate(a)
    expected = check_expected(a.expect)
    protocol = s.get("protocol", DEFAULT_PROTOCOL)
    prov = Provenance("evaluate_loglik", {**s, "protocol": protocol}, inputs={**inputs, "data": a.data}, params=s)
    prov.expected = expected
    rows = read_jsonl(a.data, required=("id", "context", "choices", "label"))
    result = evaluate_ood(model_path, rows, protocol, s.get("cot_max_tokens", 512), s.get("answer_max_tokens", 32),
                          s.get("batch_size", 64), s.get("loglik_batch_size", 32), s.get("dtype", "float32"), a.threads)
    if not inputs:
        prov.add_external("base_model", f"{model_path}@{result['model_revision'] or 'unknown revision'}")
    write_json(a.out, {**result, **_selection_record(a), "provenance": prov.record()})
    print(f"{protocol} accuracy {result['accuracy']:.4f} (cloze {result['accuracy_cloze']:.4f}), "
          f"NLL of the correct answer {result['nll_correct']:.3f} nats/token ({result['seconds']} s)")


def cmd_tables(a) -> None:
    from softtokens.reporting import write_tables

    write_tables([Path(p) for p in a.inputs], Path(a.out_dir), _settings(a.settings))


def cmd_figures(a) -> None:
    from softtokens.reporting import write_figures

    write_figures([Path(p) for p in a.metrics], [Path(p) for p in a.evals], Path(a.out_dir), _settings(a.settings))


def cmd_ablations(a) -> None:
    from softtokens.ablations import write_ablations

    write_ablations([Path(p) for p in a.evals], [Path(p) for p in a.metrics], Path(a.tables_dir),
                    Path(a.figures_dir), _settings(a.settings))


def cmd_report(a) -> None:
    from softtokens.report_page import write_report

    data = write_report([Path(p) for p in a.inputs], Path(a.bench_dir), Path(a.out_dir), _settings(a.settings))
    for c in data["claims_ours"]:
        print(f"{c.summary():<26} {c.statement}")


def cmd_audit(a) -> int:
    from softtokens.provenance import audit

    if (a.row is None) != (a.column is None):
        raise SystemExit("--row and --column go together (one table cell)")
    if a.row is not None:
        from softtokens.reporting import audit_cell

        try:
            lines, problems = audit_cell(a.path, a.row, a.column)
        except KeyError as e:
            raise SystemExit(e.args[0]) from None
        print("\n".join(lines))
        return 1 if problems else 0
    lines, problems = audit(a.path)
    print("\n".join(lines))
    print(f"\n{problems} problem(s)" if problems else "\nchain complete: every input present and unchanged")
    return 1 if problems else 0


# ---------------------------------------------------------------- parser
def _add_model_args(c: argparse.ArgumentParser) -> None:
    """What to evaluate: a base model or a trained run's selected checkpoint; CPU threads."""
    g = c.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", help="base model: hub id or local directory")
    g.add_argument("--selected", help="selected.json of a trained run")
    c.add_argument("--threads", type=int, default=1)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="softtokens", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("prepare-data", help="write train/validation/test JSONL for one dataset")
    c.add_argument("--dataset", required=True)
    c.add_argument("--settings", required=True)
    c.add_argument("--out-dir", required=True)
    c.add_argument("--splits", default="train,validation,test",
                   help="comma-separated: train,validation (a training set) and/or test (a benchmark)")
    c.set_defaults(func=cmd_prepare_data)

    c = sub.add_parser("build-toy-base", help="tokenizer + tiny Llama + supervised CoTs")
    c.add_argument("--expect", nargs="*", default=[], metavar="PATH=HASH",
                   help="upstream outputs and the settings hash the current config gives them; a mismatch stops")
    for arg in ("--settings", "--train", "--validation", "--out"):
        c.add_argument(arg, required=True)
    c.add_argument("--threads", type=int, default=1)
    c.set_defaults(func=cmd_build_toy_base)

    c = sub.add_parser("train", help="RLOO on one (model, dataset, mode, seed)")
    c.add_argument("--expect", nargs="*", default=[], metavar="PATH=HASH",
                   help="upstream outputs and the settings hash the current config gives them; a mismatch stops")
    for arg in ("--settings", "--base", "--train", "--validation", "--state-dir", "--checkpoints", "--metrics"):
        c.add_argument(arg, required=True)
    c.add_argument("--threads", type=int, default=1)
    c.set_defaults(func=cmd_train)

    c = sub.add_parser("select", help="pick the best checkpoint by greedy validation")
    for arg in ("--metrics", "--checkpoints", "--out"):
        c.add_argument(arg, required=True)
    c.set_defaults(func=cmd_select)

    c = sub.add_parser("evaluate", help="one model x benchmark x inference setting (or several settings)")
    c.add_argument("--expect", nargs="*", default=[], metavar="PATH=HASH",
                   help="upstream outputs and the settings hash the current config gives them; a mismatch stops")
    c.add_argument("--settings", required=True)
    c.add_argument("--setting", required=True, nargs="+", help="one or more inference settings")
    c.add_argument("--data", required=True)
    c.add_argument("--out", required=True, nargs="+", help="one output file per --setting, in order")
    _add_model_args(c)
    c.set_defaults(func=cmd_evaluate)

    c = sub.add_parser("evaluate-loglik", help="one model x multiple-choice benchmark: accuracy (the paper's generative protocol, or cloze) and the NLL of the correct answer")
    c.add_argument("--expect", nargs="*", default=[], metavar="PATH=HASH",
                   help="upstream outputs and the settings hash the current config gives them; a mismatch stops")
    c.add_argument("--settings", required=True)
    c.add_argument("--data", required=True)
    c.add_argument("--out", required=True)
    _add_model_args(c)
    c.set_defaults(func=cmd_evaluate_loglik)

    c = sub.add_parser("tables", help="tables of mean ± std over seeds (md, tex, csv)")
    c.add_argument("--settings", required=True)
    c.add_argument("--out-dir", required=True)
    c.add_argument("inputs", nargs="+")
    c.set_defaults(func=cmd_tables)

    c = sub.add_parser("figures", help="training curves and entropy profiles (png)")
    c.add_argument("--settings", required=True)
    c.add_argument("--out-dir", required=True)
    c.add_argument("--metrics", nargs="+", required=True)
    c.add_argument("--evals", nargs="+", required=True)
    c.set_defaults(func=cmd_figures)

    c = sub.add_parser("ablations", help="the appendix ablation tables and greedy-validation figures")
    c.add_argument("--settings", required=True)
    c.add_argument("--tables-dir", required=True)
    c.add_argument("--figures-dir", required=True)
    c.add_argument("--metrics", nargs="*", default=[])
    c.add_argument("--evals", nargs="*", default=[])
    c.set_defaults(func=cmd_ablations)

    c = sub.add_parser("plan", help="per-GPU memory of every training and evaluation job of a grid")
    c.add_argument("--config", default="config.yaml")
    c.add_argument("--grid", default=None, help="default: the config's `grid`")
    c.set_defaults(func=cmd_plan)

    c = sub.add_parser("gpu-check", help="the paper's GPU path in one command (engine, evaluation, training): "
                                         "DIR/gpu_check.json and .md (docs/gpu.md)")
    c.add_argument("--out", required=True, help="directory for gpu_check.json and gpu_check.md")
    c.add_argument("--smoke", action="store_true", help="a tiny model at cut sizes: the same code in seconds (CI)")
    c.add_argument("--config", default="config.yaml", help="the paper grid's settings are read from here")
    c.add_argument("--sections", default=None, help="comma-separated subset of engine,evaluation,training")
    c.add_argument("--modes", default="soft", help="training modes to step, comma-separated (hard,soft,fuzzy)")
    c.add_argument("--steps", type=int, default=None, help="RLOO steps per mode (default 2)")
    c.add_argument("--repeats", type=int, default=None, help="timed rollouts per setting (median; default 2)")
    c.add_argument("--eval-cot", type=int, default=None, help="evaluation CoT budget (default: the paper grid's)")
    c.add_argument("--work-dir", type=Path, default=None, help="where the random base and checkpoints go (temp)")
    c.add_argument("--device", default=None, help="default: cuda if present, else cpu")
    c.set_defaults(func=cmd_gpu_check)

    c = sub.add_parser("report", help="reproduction report: ours beside the paper, claims, cost ledger")
    c.add_argument("--settings", required=True, help="JSON: grid, gpus per rule, optional paper_results")
    c.add_argument("--bench-dir", required=True, help="the grid's Snakemake benchmark files")
    c.add_argument("--out-dir", required=True)
    c.add_argument("inputs", nargs="+", help="evaluation files (math settings and loglik.json)")
    c.set_defaults(func=cmd_report)

    c = sub.add_parser("audit", help="print the provenance chain of a result file, or of one table cell")
    c.add_argument("path", help="a result file, or a table (results/<grid>/tables/main.md) with --row/--column")
    c.add_argument("--row", help='table row: model and training as printed, e.g. "toy toyarith hard", "toy no finetune"')
    c.add_argument("--column", help='table column as printed, e.g. "toyarith Greedy pass@1"')
    c.set_defaults(func=cmd_audit)
    return p


def main(argv: list[str] | None = None) -> int:
    # CUDA's caching allocator grows in expandable segments instead of fixed blocks: on an H100 the
    # update pass of llama-3b on one GPU held 72.2 GB but reserved 81.6 GB, the whole card, in blocks
    # it could not reuse (docs/gpu.md). Read at the first CUDA allocation; a user's setting wins.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    args = build_parser().parse_args(argv)
    rc = args.func(args)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
