"""Every result path of the layout, built and parsed in one place (DESIGN.md, "Result paths").

Why one module: the rules name files, reporting and the ledger read them back, and the audit
follows them; when each did its own path arithmetic, a new key (the ablation variant) would have
had to be taught to all of them and one would have been missed. A run is (model, dataset, mode,
variant, seed). The paper's main cells are the default variant ``""`` and keep their paths; a
variant adds ``@{variant}`` to the mode ("arm"):

    {results}/data/{dataset}/{split}.jsonl
    {results}/models/{model}/                                    a built toy base
    {results}/runs/{model}/{dataset}/{arm}/seed{seed}/          metrics.jsonl, selected.json, checkpoints/
    {results}/eval/{model}/{trained}/{benchmark}/{setting}.json  trained = base | {dataset}-{arm}-seed{seed}
    {results}/eval/{model}/{trained}/{benchmark}/loglik.json    out-of-domain
    {results}/tables/{name}.{md,tex,csv,cells.json}              main, ood, settings_{benchmark}, ablation_{name}
    {results}/figures/{kind}_{keys}.{png,pdf}                    training, passk, entropy, ablation
    {results}/report/                                            reproduction.{md,html}, ledgers, claims.json
    {results}/logs/{rule}/{job}.log, {results}/benchmarks/{rule}/{job}.tsv
    arm = {mode} | {mode}@{variant}          e.g. fuzzy, fuzzy@gamma1.0, soft@logits-top5

Dataset names hold no '-' (config.check_config), modes are fixed words and '@' appears in no
other key, so every path parses back to its keys without ambiguity.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from softtokens.config.names import ARM_RE, MODE_RE, MODES, SETTING_RE, VARIANT_RE

DATASET_RE = r"[A-Za-z0-9_.]+"
# Snakemake wildcard constraints (grid/jobs.py), the same patterns the parsers below use
TRAINED_RE = rf"base|{DATASET_RE}-{ARM_RE}-seed\d+"
WILDCARDS = {"model": r"[A-Za-z0-9_.-]+", "dataset": DATASET_RE, "benchmark": DATASET_RE, "arm": ARM_RE,
             "seed": r"\d+", "setting": SETTING_RE, "trained": TRAINED_RE}
_ARM = re.compile(rf"(?P<mode>{MODE_RE})(?:@(?P<variant>{VARIANT_RE}))?")
_TRAINED = re.compile(rf"(?P<dataset>{DATASET_RE})-(?P<arm>{ARM_RE})-seed(?P<seed>\d+)")


class Run(NamedTuple):
    """One training run of a grid."""

    model: str
    dataset: str
    mode: str
    variant: str
    seed: int

    @property
    def arm(self) -> str:
        return arm(self.mode, self.variant)

    @property
    def trained(self) -> str:
        """The run's name in evaluation paths."""
        return f"{self.dataset}-{self.arm}-seed{self.seed}"

    @property
    def wildcards(self) -> str:
        """model/dataset/arm/seed{seed}: how logs and benchmark files name the run's jobs (RUN_JOB)."""
        return RUN_JOB.format(model=self.model, dataset=self.dataset, arm=self.arm, seed=self.seed)


def arm(mode: str, variant: str = "") -> str:
    if mode not in MODES:
        raise ValueError(f"unknown training mode {mode!r} (one of {', '.join(MODES)})")
    if variant and not re.fullmatch(VARIANT_RE, variant):
        raise ValueError(f"variant {variant!r}: use letters, digits and _ . + - only")
    return f"{mode}@{variant}" if variant else mode


def parse_arm(text: str) -> tuple[str, str]:
    """'fuzzy@gamma1.0' -> ('fuzzy', 'gamma1.0'); 'soft' -> ('soft', '')."""
    m = _ARM.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not a training arm (mode or mode@variant)")
    return m["mode"], m["variant"] or ""


def parse_trained(text: str) -> Run | None:
    """'gsm8k-fuzzy@tau0.01-seed1' -> Run('', 'gsm8k', 'fuzzy', 'tau0.01', 1) (no model); 'base' -> None."""
    if text == "base":
        return None
    m = _TRAINED.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not 'base' or '{{dataset}}-{{mode}}[@{{variant}}]-seed{{seed}}'")
    mode, variant = parse_arm(m["arm"])
    return Run("", m["dataset"], mode, variant, int(m["seed"]))


def run_dir(results: str, run: Run) -> str:
    return f"{results}/runs/{run.model}/{run.dataset}/{run.arm}/seed{run.seed}"


def eval_path(results: str, model: str, trained: str, benchmark: str, setting: str) -> str:
    return f"{results}/eval/{model}/{trained}/{benchmark}/{setting}.json"


def loglik_path(results: str, model: str, trained: str, benchmark: str) -> str:
    return f"{results}/eval/{model}/{trained}/{benchmark}/loglik.json"


def data_path(results: str, dataset: str, split: str) -> str:
    return f"{results}/data/{dataset}/{split}.jsonl"


def parse_eval_path(path: str | Path) -> dict:
    """.../eval/{model}/{trained}/{benchmark}/{setting}.json -> model, train_dataset, train_mode,
    variant, seed, benchmark, setting (a base model: training 'none', seed 0)."""
    p = Path(path)
    setting, benchmark, trained, model = p.stem, p.parent.name, p.parent.parent.name, p.parent.parent.parent.name
    run = parse_trained(trained)
    if run is None:
        dataset, mode, variant, seed = "none", "none", "", 0
    else:
        dataset, mode, variant, seed = run.dataset, run.mode, run.variant, run.seed
    return {"model": model, "train_dataset": dataset, "train_mode": mode, "variant": variant, "seed": seed,
            "benchmark": benchmark, "setting": setting}


def parse_run_path(path: str | Path) -> dict:
    """.../runs/{model}/{dataset}/{arm}/seed{seed}/{file} -> model, train_dataset, train_mode, variant, seed."""
    seed_dir = Path(path).parent
    mode, variant = parse_arm(seed_dir.parent.name)
    return {"model": seed_dir.parent.parent.parent.name, "train_dataset": seed_dir.parent.parent.name,
            "train_mode": mode, "variant": variant, "seed": int(seed_dir.name.removeprefix("seed"))}


def eval_run(keys: dict) -> Run | None:
    """The training run behind an evaluation file's keys (parse_eval_path), None for a base model."""
    if keys["train_mode"] == "none":
        return None
    return Run(keys["model"], keys["train_dataset"], keys["train_mode"], keys.get("variant", "") or "",
               int(keys["seed"]))


def selection_of_eval(path: str | Path) -> Path | None:
    """The selected.json of the run an evaluation file evaluates (None for a base model): the file its
    record must name (audit.links)."""
    p = Path(path)
    run = eval_run(parse_eval_path(p))
    results = p.parents[4].as_posix()   # {results}/eval/{model}/{trained}/{benchmark}/{file}
    return None if run is None else Path(run_dir(results, run)) / SELECTED


# Snakemake patterns of the same paths (wildcards in braces), for the rules' inputs and outputs
def run_pattern(results: str) -> str:
    return f"{results}/runs/{{model}}/{{dataset}}/{{arm}}/seed{{seed}}"


def eval_pattern(results: str) -> str:
    return eval_path(results, "{model}", "{trained}", "{benchmark}", "{setting}")


def loglik_pattern(results: str) -> str:
    return loglik_path(results, "{model}", "{trained}", "{benchmark}")


def data_pattern(results: str, split: str) -> str:
    return data_path(results, "{dataset}", split)


# ---------------------------------------------------------------- files of a run
METRICS = "metrics.jsonl"
SELECTED = "selected.json"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"  # a run's TensorBoard event files (train.telemetry)
RESUME = "_resume"          # the resume state: not a declared output, so a failed job keeps it
ATTEMPTS = "attempts.jsonl"  # beside the resume state (train.loop)


def model_dir(results: str, model: str) -> str:
    return f"{results}/models/{model}"


def model_progress(model_dir_: str) -> str:
    """Where a toy base being built in ``model_dir_`` writes how far it is, beside it (undeclared:
    `softtokens status` reads it; removed when the model is written)."""
    parent, name = model_dir_.rstrip("/").rsplit("/", 1)
    return f"{parent}/.{name}.progress.json"


# ---------------------------------------------------------------- tables, figures, report
TABLE_EXTS = ("md", "tex", "csv", "html")  # html: shown inline by `snakemake --report`
CELLS_EXT = "cells.json"     # each table cell's evaluation files (softtokens audit --row/--column)
FIGURE_EXTS = ("png", "pdf")
MAIN_TABLE, OOD_TABLE = "main", "ood"
REPORT_FILES = ("reproduction.md", "reproduction.html", "cells.csv", "ledger.csv", "ledger_cells.csv",
                "ledger_tables.csv", "claims.json",
                "ledger.html", "ledger_tables.html")  # html: the ledgers as `snakemake --report` shows them


PAPER_CLAIMS = "paper_claims.json"   # report/: the paper's claims judged on its own numbers (a job of its own)

SETTINGS_TABLE_PREFIX = "settings_"


def settings_table(benchmark: str) -> str:
    return f"{SETTINGS_TABLE_PREFIX}{benchmark}"


def settings_benchmark(table: str) -> str:
    """settings_gsm8k -> gsm8k."""
    if not table.startswith(SETTINGS_TABLE_PREFIX):
        raise ValueError(f"{table!r} is not a settings table ({SETTINGS_TABLE_PREFIX}<benchmark>)")
    return table.removeprefix(SETTINGS_TABLE_PREFIX)


def ablation_name(table: str) -> str:
    return f"ablation_{table}"


SWEEP_SUMMARY = "sweeps"   # tables/sweeps.json: every sweep's selected value beside the paper's (report.sweeps)


def sweep_name(model: str) -> str:
    """A model's sweep table and figure: tables/sweep_{model}.md, figures/sweep_{model}.png."""
    return f"sweep_{model}"


# the paper's Figure 3 ("Hard inference pass@k for Llama models"): its figure, hardpassk_llama.png
FIG3_KIND, FIG3_FAMILY = "hardpassk", "llama"


def figure_name(kind: str, *keys: str) -> str:
    """training_{model}_{dataset}, passk_/entropy_{model}_{dataset}_{benchmark}, ablation_{table}."""
    return "_".join((kind, *keys))


def figure_kind(path: str | Path) -> str:
    return Path(path).name.split("_")[0]


def table_path(results: str, name: str, ext: str) -> str:
    return f"{results}/tables/{name}.{ext}"


def figure_path(results: str, name: str, ext: str = "png") -> str:
    return f"{results}/figures/{name}.{ext}"


def report_path(results: str, name: str) -> str:
    return f"{results}/report/{name}"


RERUNS = "audit/reruns.jsonl"   # under a grid's results: every `softtokens audit --rerun` outcome (audit.rerun)


def reruns_path(results: str) -> str:
    return f"{results}/{RERUNS}"


def cells_path(table: str | Path) -> Path:
    """The cells file beside a table (any of its formats)."""
    table = Path(table)
    return table.with_name(f"{table.name.split('.')[0]}.{CELLS_EXT}")


# a job's name in its log and benchmark paths (the ledger reads the costs back by these names)
RUN_JOB = "{model}/{dataset}/{arm}/seed{seed}"
EVAL_JOB = "{model}/{trained}/{benchmark}"
MODEL_EVAL_JOB = "{model}/{trained}"   # the evaluate job of a whole evaluated model (evaluation.one_job_per_setting: false)


def eval_job(setting: str, model: str = "{model}", trained: str = "{trained}", benchmark: str = "{benchmark}") -> str:
    """An evaluate job of one setting (a pattern by default)."""
    return f"{EVAL_JOB.format(model=model, trained=trained, benchmark=benchmark)}/{setting}"


def model_eval_job(model: str = "{model}", trained: str = "{trained}") -> str:
    """The job that evaluates one model (base or trained run) on every benchmark, setting and out-of-domain set."""
    return MODEL_EVAL_JOB.format(model=model, trained=trained)


def job_id(rule: str, job: str) -> str:
    return f"{rule}/{job}"


def log_path(results: str, rule: str, job: str | None = None) -> str:
    """A job's log; a rule with one job per grid (the reports) has none of its own (``job`` None)."""
    return f"{results}/logs/{rule}.log" if job is None else f"{results}/logs/{rule}/{job}.log"


def benchmark_path(results: str, rule: str, job: str | None = None) -> str:
    """A job's Snakemake benchmark file; the ledger reads the rule from its first path segment."""
    return f"{results}/benchmarks/{rule}.tsv" if job is None else f"{results}/benchmarks/{rule}/{job}.tsv"

