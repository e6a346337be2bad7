# Shared by all rules: the config check, and the grid's jobs from softtokens.run.jobs (targets,
# settings, resources: plain, unit-tested Python). Rules only name files and call the CLI.
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from softtokens.data.sources import check_local_sources, loader_kind
from softtokens.run import paths
from softtokens.run.names import alternation
from softtokens.run.paths import ALL_SETTINGS, EVAL_JOB, RUN_JOB
from softtokens.run.config import check_config
from softtokens.run.interrupted import interrupted_note
from softtokens.run.jobs import GridJobs
from softtokens.run.summaries import stale_summaries
from softtokens.run.targets import outside_grid
from softtokens.train.architecture import check_model_sources
from softtokens.train.plan import check_plan, resolve_memory

# messages that name the key ('grids.toy.rl.steps') and its file and line; also completes every `reuse:`
# grid. The files in the order they apply: the workflow's config.yaml, then each --configfile over it.
CONFIG_FILES = [f for f in workflow.configfiles if f not in workflow.overwrite_configfiles]
CONFIG_FILES += list(workflow.overwrite_configfiles)
check_config(config, loader_kind, CONFIG_FILES)
# a dataset read from a local copy that is not there is refused now, not in its first job
check_local_sources(config, config["grid"])
# a model id that names nothing (a typo of a hub id) stops here with its line and the closest shipped id
check_model_sources(config, config["grid"], CONFIG_FILES)
# every job's per-GPU memory against the grid's GPUs, before any job starts (`softtokens plan`)
check_plan(config, config["grid"])

# Jobs run `python -m softtokens`; put the interpreter that runs Snakemake (the project's
# .venv) first on PATH so a bare `.venv/bin/snakemake` works without activating anything.
# (With --software-deployment-method conda, the rule's conda env comes first instead.)
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])

JOBS = GridJobs(config, resolve_rl=resolve_memory)  # `auto` micro-batch / checkpointing: the memory plan's
RESULTS = JOBS.results


def command_line_targets() -> list:
    """The targets of this `snakemake` command line (Snakemake hands them to the workflow only after
    this file runs): read with Snakemake's own parser; none where they cannot be read."""
    try:
        from snakemake.cli import get_argument_parser

        return list(get_argument_parser().parse_known_args(sys.argv[1:])[0].targets or [])
    except (Exception, SystemExit):
        return []


# outputs an interrupted job left incomplete, said in words before Snakemake's 'Forced execution'
INTERRUPTED = interrupted_note()
if INTERRUPTED:
    print(INTERRUPTED, file=sys.stderr)

# a target naming a run or evaluation outside the grid (a typo'd seed) would be planned as new work
OUTSIDE = outside_grid(JOBS, command_line_targets())
if OUTSIDE:
    raise WorkflowError(f"target(s) outside grid {config['grid']!r} (config.yaml):\n  " + "\n  ".join(OUTSIDE)
                        + "\nAdd them to the grid's training cells or evaluation to make them.")
EVAL = JOBS.eval
RUN = paths.run_pattern(RESULTS)  # a run's directory, as a wildcard pattern
GPU_RULE_ENV = JOBS.gpu_rule_env()
CPU_ENV = "../../envs/softtokens.yaml"


wildcard_constraints:
    **paths.WILDCARDS,


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
    have left of it (softtokens.run.backups decides what to do)."""
    from snakemake.io import is_flagged
    from softtokens.run.backups import settle

    pairs = [(Path(f), workflow.persistence._get_backup_path(Path(f)))
             for job in workflow.dag.needrun_jobs() for f in job.output if is_flagged(f, "update")]
    for line in settle(pairs):
        print(f"softtokens: {line}")


def slurm_status_check(workflow):
    """Stop before submitting anything when the SLURM executor would follow its jobs with a
    `sacct` that fails (no accounting): Snakemake would otherwise wait forever (run/slurm_check.py)."""
    from softtokens.run.slurm_check import status_command_problem

    plugin = workflow.executor_plugin
    if plugin is None or getattr(plugin, "name", None) != "slurm" or workflow.dryrun:
        return
    problem = status_command_problem(getattr(workflow.executor_settings, "status_command", None))
    if problem:
        raise WorkflowError(problem)
