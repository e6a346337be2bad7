"""What the workflow checks before any job, in one place: the config and every name in it, the
models and local data it names, the memory plan, the judge's margins, the command line's targets and
its `--forcerun` words, the outputs an interrupted job left, and on a cluster the pre-flight: the
SLURM commands the executor needs, accounting, and the data and weights each job will fetch (cached,
or a hub that answers). `softtokens plan` and every command that reads a grid run the same checks
(``check_grid``).

Why here and not in workflow/rules/common.smk: what decides whether a run may start is Python, tested
as Python; the glue only calls ``startup`` and ``onstart``. Why before any job: a mistake found by the
hundredth job of a cluster run costs the ninety-nine before it (a SLURM line run where there is no
SLURM once retried every data job three times, then crashed inside the plugin two minutes in)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from softtokens.store import paths

SLURM_COMMANDS = ("sbatch", "squeue", "scancel")   # sacct too where the status command is sacct (slurm_check)
HUB_TIMEOUT_S = 5.0


class Refused(Exception):
    """A run that must not start; the message says why, one line per cause, each with its fix."""


def cli_args():
    """The `snakemake` command line as Snakemake reads it, its profile applied (None where it cannot be read:
    the workflow is being parsed by something else, e.g. `snakemake --lint` in a test)."""
    try:
        from snakemake.cli import parse_args

        return parse_args(sys.argv[1:])[1]
    except (Exception, SystemExit):
        return None


# ---------------------------------------------------------------- the config
def check_grid(config: dict, grid: str, config_files=()) -> None:
    """Every check a grid gets before it is used, by the workflow and by every command alike: the
    config (schema, names with file:line and the closest valid one), the models it names, its local
    data copies, and the judge's margins (ConfigError)."""
    from softtokens.data.sources import check_local_sources, loader_kind
    from softtokens.config.grids import ConfigError, check_config
    from softtokens.sizing.architecture import check_model_sources
    from softtokens.sizing.gpus import resolve_gpus

    check_config(config, loader_kind, config_files)
    check_local_sources(config, grid)
    check_model_sources(config, grid, config_files)
    resolve_gpus(config, grid)   # gpus_per_run: auto / N / paper, before any job or forecast reads the GPUs
    margins = (config.get("judging") or {}).get("margins")
    if margins:
        from softtokens.verdict.claims import margin_problems

        problems = margin_problems(margins)
        if problems:
            raise ConfigError("\n".join(problems))


# ---------------------------------------------------------------- the command line
def forcerun_trap(forcerun, rules: set[str], targets=()) -> str | None:
    """`--forcerun RULE TARGET` with no target before it reads TARGET as a second word to force and runs the
    default target: RULE forced on the whole grid (on the paper grid, 864 evaluations). Snakemake's --forcerun
    takes rules or files, so `TARGET --forcerun TARGET`, `-R FILE` and `TARGET --forcerun RULE` are commands of
    their own and run as written; caught is only a path among the words beside a rule name with no target
    before them (the target the user meant). Returns the corrected command, or None."""
    if targets:
        return None
    words = list(forcerun or ())
    rule_words = [w for w in words if w in rules]
    stray = [w for w in words if w not in rules and ("/" in w or "." in w)]
    if not (stray and rule_words):
        return None
    return (f"--forcerun took {', '.join(stray)} as what to force beside {', '.join(rule_words)}, with no target "
            f"before it: this would force {', '.join(rule_words)} on the whole grid. Put the target first: "
            f"snakemake {' '.join(stray)} --forcerun {' '.join(rule_words)}")


def locked(workdir: str | Path = ".") -> bool:
    """Whether another Snakemake holds this working directory (its lock files): then its jobs' outputs
    are being written, not left incomplete."""
    locks = Path(workdir) / ".snakemake" / "locks"
    return locks.is_dir() and any(locks.iterdir())


# ---------------------------------------------------------------- the cluster pre-flight
def slurm_problems(which=shutil.which, status_command: str | None = None) -> list[str]:
    """The SLURM commands the executor needs, and accounting where job states come from sacct."""
    from softtokens.workflow.slurm_check import status_command_problem

    missing = [c for c in SLURM_COMMANDS if not which(c)]
    if missing:
        return [f"SLURM is not here: {', '.join(missing)} not found on PATH. Run the `--profile slurm` lines on a "
                "cluster's login node; here, drop the profile (snakemake --cores N) or use --profile profiles/local"]
    problem = status_command_problem(status_command, which=which)
    return [problem] if problem else []


def hub_reachable(endpoint: str | None = None, timeout: float = HUB_TIMEOUT_S) -> str | None:
    """None when the Hugging Face hub answers; else why not (offline mode, or the error)."""
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False"):
        return "HF_HUB_OFFLINE is set"
    import urllib.request

    url = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/") + "/api/whoami-v2"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout)
    except urllib.error.HTTPError:
        return None   # it answered (401 without a token): reachable
    except (OSError, ValueError) as err:
        return f"{type(err).__name__}: {getattr(err, 'reason', err)}"
    return None


def cached_repos() -> set[tuple[str, str]]:
    """(repo type, repo id) of everything in the Hugging Face cache (models and datasets)."""
    try:
        from huggingface_hub import scan_cache_dir

        return {(r.repo_type, r.repo_id) for r in scan_cache_dir().repos}
    except Exception:   # no cache directory yet
        return set()


def fetches(config: dict, grid_name: str, targets=()) -> list[tuple[str, str, str]]:
    """(repo type, hub id, what needs it) of the data sets and base weights the jobs of ``targets`` (none: the whole
    grid) will fetch: those whose outputs do not exist yet and that no local copy serves."""
    from softtokens.data.sources import SOURCES
    from softtokens.grid.jobs import GridJobs
    from softtokens.config.names import built_by_workflow
    from softtokens.grid.targets import target_needs

    jobs = GridJobs({**config, "grid": grid_name})
    grid = jobs.grid
    wanted = target_needs(jobs, list(targets or []))   # (datasets, models), None: everything
    out = []
    for name, spec in grid["datasets"].items():
        if wanted is not None and name not in wanted[0]:
            continue
        source = SOURCES.get(spec["loader"])
        if source is None or spec.get("path"):
            continue
        splits = [s for split in source.splits for s in (("train", "validation") if split == "train" else (split,))]
        if not all(Path(paths.data_path(jobs.results, name, s)).exists() for s in splits):
            out.append(("dataset", spec.get("source") or source.hub_id, f"datasets.{name}"))
    for model, spec in grid["models"].items():
        src = spec["source"]
        if built_by_workflow(src) or Path(src).exists() or (wanted is not None and model not in wanted[1]):
            continue
        runs = [r for r in jobs.training_runs() if r.model == model]
        pending = any(not (Path(paths.run_dir(jobs.results, r)) / paths.SELECTED).exists() for r in runs) or any(
            not Path(p).exists() for p in jobs.eval_targets() if paths.parse_eval_path(p)["model"] == model)
        if pending:
            out.append(("model", src, f"models.{model}"))
    return out


def fetch_problems(config: dict, grid_name: str, reachable=hub_reachable, cached=cached_repos, targets=()) -> list[str]:
    """Each data set or model a job of ``targets`` (none: the grid) will fetch that is neither cached nor reachable:
    one line with the fix."""
    needed = fetches(config, grid_name, targets)
    if not needed:
        return []
    have = cached()
    missing = [(kind, repo, key) for kind, repo, key in needed if (kind, repo) not in have]
    if not missing:
        return []
    why = reachable()
    if why is None:
        return []
    return [f"{key}: {kind} {repo} is not in the Hugging Face cache and the hub cannot be reached ({why}): download "
            f"it where the hub is reachable (hf download {'--repo-type dataset ' if kind == 'dataset' else ''}{repo}) "
            f"into a shared HF_HOME, or point grids.{grid_name}.{key}."
            f"{'path' if kind == 'dataset' else 'source'} at a local copy" for kind, repo, key in missing]


def preflight(config: dict, grid_name: str, status_command: str | None = None, targets=()) -> list[str]:
    """Everything a cluster run of ``targets`` (none: the whole grid) would stop on before its first job (empty: it
    may start)."""
    problems = slurm_problems(status_command=status_command)
    return problems + fetch_problems(config, grid_name, targets=targets)


# ---------------------------------------------------------------- memory on one machine
LOCAL_EXECUTORS = (None, "local", "dryrun")


def memory_problems(needs: list[tuple[str, int]], bound_mb: int, what: str) -> list[str]:
    """Each job whose declared memory is more than ``bound_mb``: it could not run here without being killed."""
    return [f"{job} needs {mb:,} MB of host memory (its plan, sizing.host), more than {what} ({bound_mb:,} MB): lower "
            f"its micro_batch_size or batch_size, or run it where there is more" for job, mb in needs if mb > bound_mb]


def bound_local_memory(workflow, jobs, dryrun: bool) -> None:
    """On one machine, the sum of the running jobs' declared memory never exceeds what the machine has: where the
    user set no memory bound (--resources mem_mb=...), it is the memory available now; a job that cannot fit the
    bound is refused before any job starts (with -n: said)."""
    from softtokens.grid.memory import job_memory
    from softtokens.sizing.host import MB, machine_memory

    total, available = machine_memory()
    given = {k: v for k, v in workflow.global_resources.items() if k.startswith("mem")}
    if given:
        key, value = next(iter(given.items()))
        value = getattr(value, "value", value)
        bound, what = int(value * {"mem_gb": 1000, "mem_mib": 1.048576, "mem_gib": 1073.741824}.get(key, 1)), \
            f"--resources {key}={value}"
    elif total:
        bound, what = int(available / MB), "this machine's available memory"
        workflow.register_resource("mem_mb", bound)
        if not dryrun:
            print(f"softtokens: jobs on this machine share {bound:,} MB of memory (available now; each job declares "
                  "its plan's need: `softtokens plan`); --resources mem_mb=N sets another bound", file=sys.stderr)
    else:
        return
    problems = memory_problems(job_memory(jobs), bound, what)
    if problems and dryrun:
        print("softtokens: a real run would stop before its first job:\n  " + "\n  ".join(problems), file=sys.stderr)
    elif problems:
        stop("softtokens: stopped before the first job:\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------- the workflow's entry points
# Snakemake's modes that plan or list but run no job: the pre-flight's refusals are for runs
NO_JOB_MODES = ("list_rules", "list_target_rules", "dag", "rulegraph", "filegraph", "d3dag", "summary",
                "detailed_summary", "archive", "cleanup_metadata", "cleanup_shadow", "unlock", "list_changes",
                "list_input_changes", "list_params_changes", "list_untracked", "delete_all_output",
                "delete_temp_output", "containerize", "export_cwl", "generate_unit_tests", "touch",
                "list_conda_envs", "conda_create_envs_only")


def runs_no_job(args) -> bool:
    """Whether this Snakemake command only lists, draws or cleans (`--list-rules`, `--dag`, `--summary`, `--unlock`,
    `--report` without `--report-after-run` ...): no job of it can meet a memory or SLURM problem."""
    if any(getattr(args, name, None) for name in NO_JOB_MODES):
        return True
    return bool(getattr(args, "report", None)) and not getattr(args, "report_after_run", False)


def workflow_jobs(config: dict):
    """The grid's jobs as the workflow plans them (grid.jobs.GridJobs): `auto` micro-batch / checkpointing the memory
    plan's, each job's host memory sizing.host's (the mem_mb it declares)."""
    from softtokens.grid.jobs import GridJobs
    from softtokens.sizing.host import HostPlan
    from softtokens.sizing.plan import resolve_memory

    return GridJobs(config, resolve_rl=resolve_memory, host_mb=HostPlan(config, config["grid"]).mb)


def stop(message: str) -> None:
    """End the workflow before it plans a job: the message alone on the console (a WorkflowError raised here is
    printed with the traceback lines of the Snakefile that called us), exit status 1."""
    print(message, file=sys.stderr)
    raise SystemExit(1)


def no_report_on_a_dry_run(workflow) -> None:
    """`snakemake -n --report FILE --report-after-run` plans and then writes the HTML report anyway (Snakemake's CLI
    calls the report after the dry run): a dry run writes nothing here, the report included."""
    create = workflow.create_report

    def create_unless_dry(*args, **kwargs):
        if workflow.dryrun:
            print("softtokens: a dry run writes nothing: the HTML report is left as it was", file=sys.stderr)
            return None
        return create(*args, **kwargs)

    workflow.create_report = create_unless_dry


def startup(config: dict, workflow) -> object:
    """Run when the workflow is parsed: every check above; returns the grid's jobs (grid.jobs.GridJobs).
    A problem stops Snakemake before it plans a job, in its own words (stop)."""
    from softtokens.config.grids import ConfigError
    from softtokens.workflow.interrupted import interrupted_note
    from softtokens.grid.targets import outside_grid
    from softtokens.sizing.plan import check_plan

    config_files = [f for f in workflow.configfiles if f not in workflow.overwrite_configfiles]
    config_files += list(workflow.overwrite_configfiles)
    try:
        check_grid(config, config["grid"], config_files)
    except ConfigError as err:
        stop(str(err))
    check_plan(config, config["grid"])   # every job's per-GPU memory against the grid's GPUs (`softtokens plan`)
    jobs = workflow_jobs(config)
    no_report_on_a_dry_run(workflow)
    args = cli_args()
    if args is not None:
        trap = forcerun_trap(args.forcerun, RULES, args.targets)
        if trap:
            stop(trap)
        bad = outside_grid(jobs, list(args.targets or []))
        if bad:
            stop(f"target(s) outside grid {config['grid']!r} (config.yaml):\n  " + "\n  ".join(bad)
                 + "\nAdd them to the grid's training cells or evaluation to make them.")
        runs = not runs_no_job(args)   # a command that lists, draws or cleans has nothing to refuse
        if runs and args.executor in LOCAL_EXECUTORS:
            bound_local_memory(workflow, jobs, bool(args.dryrun or getattr(args, "lint", None)))
        elif runs and args.executor == "slurm":
            problems = preflight(config, config["grid"], getattr(args, "slurm_status_command", None),
                                 list(args.targets or []))
            if problems and args.dryrun:
                print("softtokens: a real run would stop before its first job:\n  " + "\n  ".join(problems),
                      file=sys.stderr)
            elif problems:
                stop("softtokens: stopped before the first job:\n  " + "\n  ".join(problems))
    if not locked():
        note = interrupted_note()
        if note:
            print(note, file=sys.stderr)
    return jobs


# the workflow's rule names (workflow/rules/*.smk), for telling a rule from a target on the command line
RULES = {"all", "prepare_data", "prepare_benchmark", "build_toy_base", "build_packaged_base", "train",
         "select_checkpoint", "evaluate", "evaluate_loglik", "main_table", "settings_table", "ood_table",
         "training_figure", "passk_figure", "hard_passk_figure", "entropy_figure", "paper_claims", "reproduction_report",
         "ablation_tables", "sweep_tables"}
