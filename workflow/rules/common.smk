# Helpers shared by all rules: config validation, wildcard constraints, grid -> targets.
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from softtokens.config import COT_KEYS, PLACEMENT_KEYS, cell_rl, check_config, resolved_rl
from softtokens.paths import ARM_RE, DATASET_RE, TRAINED_RE, Run, parse_arm, parse_trained
from softtokens import paths
from softtokens.config import job_resources as site_job_resources
from softtokens.provenance import config_hash
from softtokens.plan import check_plan, train_processes


# our check first: its messages name the key ('grids.toy.rl.steps'); then Snakemake's own.
# check_config also completes every `reuse:` grid from the grid it names (config.resolve_grids)
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
RUN = paths.run_pattern(RESULTS)  # a run's directory, as a wildcard pattern
EVAL = GRID["evaluation"]
RL = resolved_rl(config, GRID_NAME)
OOD = EVAL.get("ood_benchmarks", [])
RESOURCES = GRID.get("resources", {})
# the conda environment of the GPU rules (train, evaluate, evaluate_loglik): torch's CUDA build pinned on a
# grid whose jobs ask for GPUs, the plain pins elsewhere (a laptop's toy grid needs no CUDA download)
GPU_RULE_ENV = "../../envs/softtokens-gpu.yaml" if RESOURCES.get("train", {}).get("gpu") else "../../envs/softtokens.yaml"
# the toy base is supervised on the first toy dataset of the grid
TOY_BASE_DATASET = next((d for d, s in GRID["datasets"].items() if s["loader"] == "toy"), None)


wildcard_constraints:
    model=r"[A-Za-z0-9_.-]+",
    dataset=DATASET_RE,
    benchmark=DATASET_RE,
    arm=ARM_RE,  # mode or mode@variant (softtokens.paths)
    seed=r"\d+",
    setting=r"(hard|soft|fuzzy)_(greedy|sample)",
    trained=TRAINED_RE,


def settle_update_backups(workflow):
    """Before any job: each update() output of a job about to run, with the backup a killed run may
    have left of it (softtokens.backups decides what to do)."""
    from snakemake.io import is_flagged
    from softtokens.backups import settle

    pairs = [(Path(f), workflow.persistence._get_backup_path(Path(f)))
             for job in workflow.dag.needrun_jobs() for f in job.output if is_flagged(f, "update")]
    for line in settle(pairs):
        print(f"softtokens: {line}")


def slurm_status_check(workflow):
    """Stop before submitting anything when the SLURM executor would follow its jobs with a
    `sacct` that fails (no accounting): Snakemake would otherwise wait forever (slurm_check.py)."""
    from softtokens.slurm_check import status_command_problem

    plugin = workflow.executor_plugin
    if plugin is None or getattr(plugin, "name", None) != "slurm" or workflow.dryrun:
        return
    problem = status_command_problem(getattr(workflow.executor_settings, "status_command", None))
    if problem:
        raise WorkflowError(problem)


# ---------------------------------------------------------------- grid expansion
def training_runs(grid=None):
    """Every training run (softtokens.paths.Run) of a grid (default: the one being built)."""
    grid = GRID if grid is None else grid
    return [
        Run(c["model"], c["dataset"], mode, c.get("variant", ""), seed)
        for c in grid["training"]
        for mode in c["modes"]
        for seed in c["seeds"]
    ]


def run_dir(run):
    return paths.run_dir(RESULTS, run)


def evaluated_models():
    """(model, trained) pairs: each evaluated base model and every run trained from it."""
    pairs = [(m, "base") for m in EVAL["models"]]
    pairs += [(r.model, r.trained) for r in training_runs()]
    return pairs


def eval_targets():
    return [
        paths.eval_path(RESULTS, m, t, b, s)
        for m, t in evaluated_models()
        for b in EVAL["benchmarks"]
        for s in EVAL["settings"]
    ]


def loglik_targets():
    return [paths.loglik_path(RESULTS, m, t, b) for m, t in evaluated_models() for b in OOD]


def ood_table_targets():
    return [f"{RESULTS}/tables/ood.{ext}" for ext in ("md", "tex", "csv")] if OOD else []


def metrics_targets():
    return [f"{run_dir(r)}/metrics.jsonl" for r in training_runs() if not r.variant]


def settings_table_targets():
    return [f"{RESULTS}/tables/settings_{b}.{ext}" for b in EVAL["benchmarks"] for ext in ("md", "tex", "csv")]


def figure_targets(ext="png"):
    """Training curves per (model, training set); pass@k and CoT entropy per (model, training
    set, benchmark), as reporting.figure_groups draws them ('base' for a model with no run)."""
    pairs = sorted({(r.model, r.dataset) for r in training_runs()})
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
    main = [f"{RESULTS}/tables/main.md", *settings_table_targets(), *ood_table_targets(), *figure_targets(),
            *figure_targets("pdf"), *REPRODUCTION]
    if not ABLATIONS:
        return main
    # an ablation grid: its appendix tables and figures; its main tables too when it has results of its
    # own (toy-long), not when it shares the reused grid's (toy-ablations, ablations: theirs are that grid's)
    own_results = REUSED is None or GRID["results"] != REUSED["results"]
    return [*(main if own_results else []), *ablation_targets()]


# ---------------------------------------------------------------- ablation grids
ABLATIONS = GRID.get("ablation_tables", {})
REUSE_NAME = GRID.get("reuse")
REUSED = config["grids"][REUSE_NAME] if REUSE_NAME else None


def ablation_targets():
    return [f"{RESULTS}/{kind}/ablation_{name}.{ext}" for name in ABLATIONS
            for kind, exts in (("tables", ("md", "tex", "csv", "cells.json")), ("figures", ("png", "pdf")))
            for ext in exts]


def ablation_cell():
    """The (model, dataset) every ablation row trains (config.check_config makes it one)."""
    return GRID["training"][0]["model"], GRID["training"][0]["dataset"]


def ablation_runs(arm):
    """Runs of one table row and the results directory they live in. A default arm (no
    variant) is the reused grid's runs when this grid has no default cell of its own."""
    model, dataset = ablation_cell()
    mode, variant = parse_arm(arm)
    own = [r for r in training_runs() if (r.model, r.dataset, r.mode, r.variant) == (model, dataset, mode, variant)]
    if own or not REUSED:
        return own, RESULTS, True
    reused = [r for r in training_runs(REUSED) if (r.model, r.dataset, r.mode, r.variant) == (model, dataset, mode, "")]
    return reused, REUSED["results"], False


def _kept(files, in_dag):
    """A reused grid's files are read when they exist and never planned: this grid does not
    retrain or re-evaluate what another grid makes (its table rows say 'not yet run' instead)."""
    return list(files) if in_dag else [f for f in files if os.path.exists(f)]


def ablation_evals(wildcards=None):
    model, _ = ablation_cell()
    out = []
    for spec in ABLATIONS.values():
        if spec.get("base"):
            in_dag = model in EVAL["models"]
            where = RESULTS if in_dag or not REUSED else REUSED["results"]
            out += _kept([paths.eval_path(where, model, "base", b, s) for b in EVAL["benchmarks"]
                          for s in EVAL["settings"]], in_dag)
        for arm in spec["arms"]:
            runs, where, in_dag = ablation_runs(arm)
            out += _kept([paths.eval_path(where, r.model, r.trained, b, s) for r in runs for b in EVAL["benchmarks"]
                          for s in EVAL["settings"]], in_dag)
    return sorted(set(out))


def ablation_metrics(wildcards=None):
    out = []
    for spec in ABLATIONS.values():
        for arm in spec["arms"]:
            runs, where, in_dag = ablation_runs(arm)
            out += _kept([f"{paths.run_dir(where, r)}/metrics.jsonl" for r in runs], in_dag)
    return sorted(set(out))


def ablation_settings(wildcards):
    """Each table's rows, in order, with what each row's run resolved to (gamma, tau, placement, k)."""
    model, dataset = ablation_cell()
    tables = {}
    for name, spec in ABLATIONS.items():
        rows = []
        for arm in spec["arms"]:
            mode, variant = parse_arm(arm)
            rl = cell_rl(config, GRID_NAME, model, dataset, variant)
            rows.append({"arm": arm, "mode": mode, "variant": variant, "noise_factor": rl["noise_factor"],
                         "temperature": rl[f"{mode}_temperature"], "placement": rl["noise_placement"],
                         "top_k": rl["noise_top_k"], "clip_ratio": rl.get("max_grad_norm_ratio", 0.0),
                         "clip_groups": rl.get("grad_clip_groups", "global")})
        tables[name] = {"title": spec.get("title", name), "rows": rows, "base": bool(spec.get("base")),
                        "describe": spec.get("describe", ["mode", "placement", "temperature", "top_k", "noise_factor"])}
    return json.dumps({"grid": GRID_NAME, "model": model, "dataset": dataset, "toy": "toy_base" in GRID,
                       "tables": tables}, sort_keys=True)


def ledger_gpus():
    """GPUs held by each job, for the ledger's GPU-hours. A training job: its model's
    train_gpus, an evaluation job its kind's `gpu` resource; every other rule none."""
    train = site_job_resources(GRID, "train").get("gpu", 0)
    return {
        "train": {m: (train_processes(GRID, m) if train else 0) for m in GRID["models"]},
        "evaluate": site_job_resources(GRID, "evaluate").get("gpu", 0),
        "evaluate_loglik": site_job_resources(GRID, "evaluate_loglik").get("gpu", 0),
    }


def variant_evals_present(wildcards=None):
    """Ablation-variant evaluation files already in this results directory (the ablations grid
    shares the paper grid's): the reproduction report puts them beside the paper's ablation
    tables when they exist; their absence never plans a job."""
    import glob

    return sorted(glob.glob(f"{RESULTS}/eval/*/*@*-seed*/*/*.json"))


def reproduction_settings(wildcards):
    return json.dumps({"grid": GRID_NAME, "toy": "toy_base" in GRID, "gpus": ledger_gpus()}, sort_keys=True)


def selected_targets():
    return [f"{run_dir(r)}/selected.json" for r in training_runs()]


def all_targets():
    """Every cell of the layout, so a deleted evaluation or selection is remade (with what
    depends on it) by a plain `snakemake`, not only the tables that summarise it."""
    return [*selected_targets(), *eval_targets(), *loglik_targets(), *report_targets()]


# ---------------------------------------------------------------- per-rule inputs and params
def dataset_settings(wildcards):
    return json.dumps(GRID["datasets"][wildcards.dataset], sort_keys=True)


def _expect(pairs):
    """`--expect PATH=HASH ...`: what the current config gives each upstream output's job, which
    the job compares with the output's provenance (provenance.check_expected; stale: it stops)."""
    items = [f"{path}={config_hash(json.loads(settings))}" for path, settings in pairs]
    return "--expect " + " ".join(items) if items else ""


def _data_expect(dataset, splits):
    settings = dataset_settings(SimpleNamespace(dataset=dataset))
    return [(paths.data_path(RESULTS, dataset, split), settings) for split in splits]


def _base_expect(model):
    if GRID["models"][model]["source"] != "toy":
        return []
    return [(model_source(model), toy_base_settings(None))]


def train_expect(wildcards):
    return _expect(_data_expect(wildcards.dataset, ("train", "validation")) + _base_expect(wildcards.model))


def eval_expect(wildcards):
    base = _base_expect(wildcards.model) if wildcards.trained == "base" else []
    return _expect(_data_expect(wildcards.benchmark, ("test",)) + base)


def toy_base_expect(wildcards):
    return _expect(_data_expect(TOY_BASE_DATASET, ("train", "validation")))


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
    mode, variant = parse_arm(wildcards.arm)
    rl = cell_rl(config, GRID_NAME, wildcards.model, wildcards.dataset, variant)
    s = dict(rl, mode=mode, seed=int(wildcards.seed), lr=GRID["models"][wildcards.model]["lr"])
    if variant:  # recorded in provenance; the default runs' settings stay as they were
        s["variant"] = variant
    return json.dumps(s, sort_keys=True)


def train_launcher(wildcards, resources):
    """One process, or one per GPU under `accelerate launch` when the job holds several GPUs
    (the profile may lower `gpu`, e.g. profiles/local: the launcher follows)."""
    gpus = int(resources.get("gpu", 0) or 0)
    if gpus <= 1:
        return "python"
    # a free rendezvous port per job, picked on the node when the job starts: two multi-GPU jobs on
    # one node would otherwise both take accelerate's default 29500
    port = "$(python -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])')"
    return (f"accelerate launch --multi_gpu --num_processes {gpus} --num_machines 1 --main_process_port {port} "
            "--mixed_precision no --dynamo_backend no")


def eval_settings(wildcards):
    """An evaluation's settings. The six inference settings derive from Section 4's CoT keys (τ, γ,
    the embedding placement: the grid's `rl`), whatever an ablation run trained with, as the paper
    evaluates its ablations; `evaluation.inference_settings: run` takes the run's own keys instead."""
    keys = ("n_samples", "cot_max_tokens", "answer_max_tokens", "batch_size", "seed")
    s = {k: EVAL[k] for k in keys if k in EVAL}
    s["dtype"] = RL["compute_dtype"]
    s["grading_timeout_s"] = RL["grading_timeout_s"]
    rl = RL
    run = parse_trained(wildcards.trained)
    if run is not None and EVAL.get("inference_settings", "section4") == "run":
        rl = cell_rl(config, GRID_NAME, wildcards.model, run.dataset, run.variant)
    s.update({k: rl[k] for k in (*COT_KEYS, *PLACEMENT_KEYS)})
    return json.dumps(s, sort_keys=True)


def loglik_settings(wildcards):
    """An out-of-domain evaluation's settings: its protocol (softtokens.ood), the CoT and answer
    budgets and decode batch of the math evaluations (the generative protocol decodes as they do)."""
    return json.dumps({"protocol": EVAL.get("ood_protocol", "generative"),
                       "loglik_batch_size": EVAL.get("loglik_batch_size", 32),
                       "batch_size": EVAL.get("batch_size", 64), "cot_max_tokens": EVAL["cot_max_tokens"],
                       "answer_max_tokens": EVAL["answer_max_tokens"], "dtype": RL["compute_dtype"]},
                      sort_keys=True)


def job_resources(kind):
    """Resources of one kind of job (train / evaluate / evaluate_loglik / cpu); see
    softtokens.config.job_resources for where partition and account come from. A training job
    takes its model's GPU count (models.<m>.train_gpus, chosen from the memory plan)."""
    res = site_job_resources(GRID, kind)
    if kind == "train" and res.get("gpu", 0) > 0:
        res["gpu"] = lambda wildcards: train_processes(GRID, wildcards.model)
    return res


def job_threads(kind):
    """CPU threads of a job: cpus_per_gpu x its GPUs on a GPU job (torch and the data work use
    them), else 1 (the CPU grids run many one-thread jobs side by side)."""
    res = site_job_resources(GRID, kind)

    def threads(wildcards):
        gpus = res.get("gpu", 0)
        if kind == "train" and gpus:
            gpus = train_processes(GRID, wildcards.model)
        return int(gpus * res.get("cpus_per_gpu", 1)) if gpus else 1

    return threads


def eval_model_input(wildcards):
    if wildcards.trained == "base":
        return base_model_input(wildcards)
    run = parse_trained(wildcards.trained)._replace(model=wildcards.model)
    return [f"{run_dir(run)}/selected.json"]


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
