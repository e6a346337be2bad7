# Shared by all rules: the checks before any job and the grid's jobs (softtokens.workflow.startup,
# softtokens.grid.jobs: targets, settings, resources, plain unit-tested Python). Rules only name files and call the CLI.
import os
import sys
from pathlib import Path

from softtokens.workflow.startup import startup
from softtokens.grid.resources import PRIORITY
from softtokens.store import paths
from softtokens.config.names import alternation
from softtokens.store.paths import EVAL_JOB, RUN_JOB
from softtokens.workflow.summaries import stale_summaries

# the config and every name in it (file:line, the closest valid one), models, local data, the memory plan, the
# command line's targets and --forcerun words, and with --profile slurm the cluster pre-flight (docs/cluster.md)
JOBS = startup(config, workflow)
RESULTS = JOBS.results
# Jobs run `python -m softtokens`; put the interpreter that runs Snakemake (the project's .venv) first on PATH so
# a bare `.venv/bin/snakemake` works without activating anything (under --sdm conda the rule's env comes first).
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
EVAL = JOBS.eval
RUN = paths.run_pattern(RESULTS)  # a run's directory, as a wildcard pattern
GPU_RULE_ENV = JOBS.gpu_rule_env()
CPU_ENV = "../../envs/softtokens.yaml"


wildcard_constraints:
    **paths.WILDCARDS,


def verbatim(text):
    """A parameter passed on as written: Snakemake reads a plain string parameter as a wildcard pattern, so a
    local copy's `path: .../{split}.jsonl` in a job's settings stopped the DAG (WildcardError)."""
    return lambda wildcards: text


def log_of(rule, job=None):
    return paths.log_path(RESULTS, rule, job)


def bench_of(rule, job=None):
    return paths.benchmark_path(RESULTS, rule, job)


def resources(kind):
    """A kind of job's resources; a training job's GPUs follow its model (models.<m>.train_gpus)."""
    res = JOBS.resources(kind)
    if callable(res.get("gpu")):
        gpus = res["gpu"]
        res["gpu"] = lambda wildcards: gpus(wildcards.model)
    return res


def threads(kind):
    return lambda wildcards: JOBS.threads(kind, getattr(wildcards, "model", None))


def processes(wildcards, resources):
    """FSDP processes of a training job: one per GPU it holds (a profile may lower `gpu`)."""
    return int(resources.get("gpu", 0) or 0) or 1


def eval_model_input(wildcards):
    return JOBS.eval_model_input(wildcards.model, wildcards.trained)


def eval_model_arg(wildcards):
    return JOBS.eval_model_arg(wildcards.model, wildcards.trained)


def eval_expect(wildcards):
    return JOBS.eval_expect(wildcards.model, wildcards.trained, wildcards.benchmark)


def output_parent(wildcards, output):
    """The directory of a rule's first output (tables/, figures/, report/)."""
    return str(Path(output[0]).parent)


def reported(files, category, caption, **labels):
    """Files marked for `snakemake --report` (the HTML of a table, shown inline; the PNG of a figure),
    each kept (update) so that a job that refuses its inputs leaves the previous ones (audit.inputs)."""
    marked = (".html", ".png")
    return [update(report(f, category=category, caption=f"../report/{caption}", labels=labels or None)
                   if f.endswith(marked) else f) for f in files]


# `snakemake --report` categories of the figures, by kind (paths.figure_name)
FIGURE_KINDS = {
    "training": ("Training curves", "figure_training.rst"),
    "passk": ("pass@k figures", "figure_passk.rst"),
    "entropy": ("CoT entropy figures", "figure_entropy.rst"),
    paths.FIG3_KIND: ("pass@k figures", "figure_passk.rst"),
}


def table_outputs(name, caption):
    """A table's files; its HTML is shown inline by `snakemake --report`."""
    out = {ext: paths.table_path(RESULTS, name, ext) for ext in (*paths.TABLE_EXTS, paths.CELLS_EXT)}
    out["html"] = report(out["html"], category="Tables", caption=f"../report/{caption}", labels={"table": name})
    return {("cells" if k == paths.CELLS_EXT else k): update(v) for k, v in out.items()}


def figure_output(kind):
    """A figure's PNG as `snakemake --report` shows it (category and caption by kind)."""
    category, caption = FIGURE_KINDS[kind]
    return update(report(paths.figure_path(RESULTS, f"{kind}_{{figure}}"), category=category,
                         caption=f"../report/{caption}", labels={"figure": "{figure}"}))


def settle_update_backups(workflow):
    """Before any job: each update() output of a job about to run, with the backup a killed run may
    have left of it (softtokens.workflow.backups decides what to do)."""
    from snakemake.io import is_flagged
    from softtokens.workflow.backups import settle

    pairs = [(Path(f), workflow.persistence._get_backup_path(Path(f)))
             for job in workflow.dag.needrun_jobs() for f in job.output if is_flagged(f, "update")]
    for line in settle(pairs):
        print(f"softtokens: {line}")
