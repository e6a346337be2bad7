# Helpers shared by all rules: config validation, wildcard constraints, grid -> targets.
import json
import os
import sys
from pathlib import Path

from snakemake.utils import validate

from softtokens.config import COT_KEYS, cell_rl, check_config, resolved_rl
from softtokens.config import job_resources as site_job_resources
from softtokens.plan import check_plan, train_processes


# our check first: its messages name the key ('grids.toy.rl.steps'); then Snakemake's own
check_config(config)
validate(config, schema="../schemas/config.schema.yaml")
# every job's per-GPU memory against the grid's GPUs, before any job starts (`softtokens plan`)
check_plan(config, config["grid"])

# Jobs run `python -m softtokens`; put the interpreter that runs Snakemake (the project's
# .venv) first on PATH so a bare `.venv/bin/snakemake` works without activating anything.
# (With --software-deployment-method conda, the rule's conda env comes first instead.)
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])

GRID_NAME = config["grid"]
GRID = config["grids"][GRID_NAME]
RESULTS = GRID["results"]
EVAL = GRID["evaluation"]
RL = resolved_rl(config, GRID_NAME)
OOD = EVAL.get("ood_benchmarks", [])
RESOURCES = GRID.get("resources", {})
# the toy base is supervised on the first toy dataset of the grid
TOY_BASE_DATASET = next((d for d, s in GRID["datasets"].items() if s["loader"] == "toy"), None)


wildcard_constraints:
    model=r"[A-Za-z0-9_.-]+",
    dataset=r"[A-Za-z0-9_.]+",
    benchmark=r"[A-Za-z0-9_.]+",
    mode=r"hard|soft|fuzzy",
    seed=r"\d+",
    setting=r"(hard|soft|fuzzy)_(greedy|sample)",
    trained=r"base|[A-Za-z0-9_.]+-(hard|soft|fuzzy)-seed\d+",


# ---------------------------------------------------------------- grid expansion
def training_runs():
    """(model, dataset, mode, seed) of every training run in the grid."""
    return [
        (c["model"], c["dataset"], mode, seed)
        for c in GRID["training"]
        for mode in c["modes"]
        for seed in c["seeds"]
    ]


def run_dir(model, dataset, mode, seed):
    return f"{RESULTS}/runs/{model}/{dataset}/{mode}/seed{seed}"


def evaluated_models():
    """(model, trained) pairs: each evaluated base model and every run trained from it."""
    pairs = [(m, "base") for m in EVAL["models"]]
    pairs += [(m, f"{d}-{mode}-seed{s}") for m, d, mode, s in training_runs()]
    return pairs


def eval_targets():
    return [
        f"{RESULTS}/eval/{m}/{t}/{b}/{s}.json"
        for m, t in evaluated_models()
        for b in EVAL["benchmarks"]
        for s in EVAL["settings"]
    ]


def loglik_targets():
    return [f"{RESULTS}/eval/{m}/{t}/{b}/loglik.json" for m, t in evaluated_models() for b in OOD]


def ood_table_targets():
    return [f"{RESULTS}/tables/ood.{ext}" for ext in ("md", "tex", "csv")] if OOD else []


def metrics_targets():
    return [f"{run_dir(*r)}/metrics.jsonl" for r in training_runs()]


def settings_table_targets():
    return [f"{RESULTS}/tables/settings_{b}.{ext}" for b in EVAL["benchmarks"] for ext in ("md", "tex", "csv")]


def figure_targets(ext="png"):
    """Training curves per (model, training set); pass@k and CoT entropy per (model, training
    set, benchmark), as reporting.figure_groups draws them ('base' for a model with no run)."""
    pairs = sorted({(m, d) for m, d, _, _ in training_runs()})
    figs = [f"{RESULTS}/figures/training_{m}_{d}.{ext}" for m, d in pairs]
    per_run = pairs + [(m, "base") for m in sorted(set(EVAL["models"]) - {m for m, _ in pairs})]
    kinds = ["entropy", "passk"]
    figs += [f"{RESULTS}/figures/{kind}_{m}_{d}_{b}.{ext}" for kind in kinds for m, d in per_run for b in EVAL["benchmarks"]]
    return figs


FIGURE_KINDS = {
    "training": ("Training curves", "figure_training.rst"),
    "passk": ("pass@k figures", "figure_passk.rst"),
    "entropy": ("CoT entropy figures", "figure_entropy.rst"),
}


def reported_figures():
    """Each PNG marked for `snakemake --report`, in its figure kind's category."""
    out = []
    for f in figure_targets():
        kind = Path(f).name.split("_")[0]
        category, caption = FIGURE_KINDS[kind]
        out.append(report(f, category=category, caption=f"../report/{caption}",
                          labels={"figure": Path(f).stem.removeprefix(f"{kind}_")}))
    return out


def reported_settings_tables():
    return [report(f"{RESULTS}/tables/settings_{b}.csv", category="Appendix tables (six inference settings)",
                   caption="../report/table_settings.rst", labels={"benchmark": b}) for b in EVAL["benchmarks"]]


REPRODUCTION = [f"{RESULTS}/report/{name}" for name in (
    "reproduction.md", "reproduction.html", "cells.csv", "ledger.csv", "ledger_cells.csv", "ledger_tables.csv",
    "claims.json")]


def report_targets():
    return [f"{RESULTS}/tables/main.md", *settings_table_targets(), *ood_table_targets(), *figure_targets(),
            *figure_targets("pdf"), *REPRODUCTION]


def ledger_gpus():
    """GPUs held by each job, for the ledger's GPU-hours. A training job: its model's
    train_gpus, an evaluation job its kind's `gpu` resource; every other rule none."""
    train = site_job_resources(GRID, "train").get("gpu", 0)
    return {
        "train": {m: (train_processes(GRID, m) if train else 0) for m in GRID["models"]},
        "evaluate": site_job_resources(GRID, "evaluate").get("gpu", 0),
        "evaluate_loglik": site_job_resources(GRID, "evaluate_loglik").get("gpu", 0),
    }


def reproduction_settings(wildcards):
    return json.dumps({"grid": GRID_NAME, "toy": "toy_base" in GRID, "gpus": ledger_gpus()}, sort_keys=True)


def selected_targets():
    return [f"{run_dir(*r)}/selected.json" for r in training_runs()]


def all_targets():
    """Every cell of the layout, so a deleted evaluation or selection is remade (with what
    depends on it) by a plain `snakemake`, not only the tables that summarise it."""
    return [*selected_targets(), *eval_targets(), *loglik_targets(), *report_targets()]


# ---------------------------------------------------------------- per-rule inputs and params
def dataset_settings(wildcards):
    return json.dumps(GRID["datasets"][wildcards.dataset], sort_keys=True)


def toy_base_settings(wildcards):
    s = dict(GRID["toy_base"])
    s.update(cot_max_tokens=RL["cot_max_tokens"], answer_max_tokens=RL["answer_max_tokens"])
    return json.dumps(s, sort_keys=True)


def model_source(model):
    """Local directory (toy) or hub id / path of a base model."""
    src = GRID["models"][model]["source"]
    return f"{RESULTS}/models/{model}" if src == "toy" else src


def base_model_input(wildcards):
    """The toy base is a DAG output; a hub model is fetched by the job itself."""
    src = GRID["models"][wildcards.model]["source"]
    return [model_source(wildcards.model)] if src == "toy" else []


def train_settings(wildcards):
    rl = cell_rl(config, GRID_NAME, wildcards.model, wildcards.dataset)
    s = dict(rl, mode=wildcards.mode, seed=int(wildcards.seed), lr=GRID["models"][wildcards.model]["lr"])
    return json.dumps(s, sort_keys=True)


def train_launcher(wildcards, resources):
    """One process, or one per GPU under `accelerate launch` when the job holds several GPUs
    (the profile may lower `gpu`, e.g. profiles/local: the launcher follows)."""
    gpus = int(resources.get("gpu", 0) or 0)
    if gpus <= 1:
        return "python"
    return (f"accelerate launch --multi_gpu --num_processes {gpus} --num_machines 1 "
            "--mixed_precision no --dynamo_backend no")


def eval_settings(wildcards):
    """An evaluation's settings. The six inference settings derive from the CoT keys (τ, γ) of
    the run that was trained (its cell's `rl:`), or of the grid for a base model, as training
    and validation do (generation.cot_settings)."""
    keys = ("n_samples", "cot_max_tokens", "answer_max_tokens", "batch_size", "seed")
    s = {k: EVAL[k] for k in keys if k in EVAL}
    s["dtype"] = RL["compute_dtype"]
    s["grading_timeout_s"] = RL["grading_timeout_s"]
    rl = RL
    if wildcards.trained != "base":
        rl = cell_rl(config, GRID_NAME, wildcards.model, wildcards.trained.rsplit("-", 2)[0])
    s.update({k: rl[k] for k in COT_KEYS})
    return json.dumps(s, sort_keys=True)


def loglik_settings(wildcards):
    return json.dumps({"batch_size": EVAL.get("loglik_batch_size", 32), "dtype": RL["compute_dtype"]},
                      sort_keys=True)


def job_resources(kind):
    """Resources of one kind of job (train / evaluate / evaluate_loglik / cpu); see
    softtokens.config.job_resources for where partition and account come from. A training job
    takes its model's GPU count (models.<m>.train_gpus, chosen from the memory plan)."""
    res = site_job_resources(GRID, kind)
    if kind == "train" and res.get("gpu", 0) > 0:
        res["gpu"] = lambda wildcards: train_processes(GRID, wildcards.model)
    return res


def eval_model_input(wildcards):
    if wildcards.trained == "base":
        return base_model_input(wildcards)
    dataset, mode, seed = wildcards.trained.rsplit("-", 2)
    return [f"{run_dir(wildcards.model, dataset, mode, seed.removeprefix('seed'))}/selected.json"]


def eval_model_arg(wildcards, input):
    if wildcards.trained == "base":
        return f"--model {model_source(wildcards.model)}"
    return f"--selected {input.model[0]}"


def report_settings(wildcards):
    return json.dumps({"grid": GRID_NAME, "n_samples": EVAL["n_samples"]}, sort_keys=True)



def base_model_arg(wildcards):
    return model_source(wildcards.model)


def output_parent(wildcards, output):
    """The directory of a rule's first output (tables/, figures/)."""
    return str(Path(output[0]).parent)
