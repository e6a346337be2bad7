# softtokens: every table and figure of "Soft Tokens, Hard Truths" from one config grid.
# The grid is config["grid"] (toy by default; profiles/slurm selects paper).
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")

# a YAML syntax error named with its file, line and column before Snakemake reads the file (its own
# message names neither)
from softtokens.config.grids import grid_files
from softtokens.config.text import check_yaml_syntax

check_yaml_syntax(Path(workflow.basedir) / "config.yaml")


configfile: "config.yaml"


# a grid of its own beside config.yaml (grids/NAME.yaml: `softtokens plan --claims` writes one), read only
# when it is the selected grid (or one it reuses), so a file made for one grid changes no other
for _grid_file in grid_files(workflow.basedir, config):

    configfile: _grid_file


# PATH is extended with the running interpreter's bin directory (workflow/rules/common.smk)
envvars:
    "PATH",


report: "workflow/report/workflow.rst"


# every job in one Apptainer image under --sdm apptainer (envs/softtokens-gpu.def, docs/gpu.md)
if config.get("container"):

    container: config["container"]


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/toy_base.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/select.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/sweep.smk"


onstart:
    # backups of update() outputs that a killed Snakemake left behind (softtokens.workflow.backups)
    settle_update_backups(workflow)


onsuccess:
    # a run of one cell leaves the tables, figures and report that summarise it older than it
    stale = stale_summaries(JOBS)
    if stale:
        shown = ", ".join(stale[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
        print(f"softtokens: {len(stale)} summary file(s) are older than a result they are made from ({shown}). "
              f"`snakemake` with no target rebuilds them; add `--report {RESULTS}/report.html --report-after-run` "
              "to rebuild the HTML report too.")


rule all:
    default_target: True
    input:
        JOBS.all_targets(),
