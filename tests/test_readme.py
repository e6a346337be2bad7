"""Every `snakemake` command README.md shows parses as written (Snakemake's own argument parser) and
plans (a dry run from the repository root), so a command in the README cannot rot; and the paper
grid's `path:` checks refuse a missing local copy in the dry run, naming the key."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PAPER_ENV = {"SOFTTOKENS_SLURM_ACCOUNT": "testacct", "SOFTTOKENS_SLURM_GPU_PARTITION": "testgpu"}


def readme_commands() -> list[str]:
    """The snakemake lines of README.md's code blocks, comments cut."""
    text = (ROOT / "README.md").read_text()
    lines = [line for block in re.findall(r"```\n(.*?)```", text, flags=re.S) for line in block.splitlines()]
    return [line.split("  #")[0].strip() for line in lines
            if re.match(r"^(\.venv/bin/)?snakemake\s", line.strip())]


def test_the_readme_shows_the_commands_a_user_runs():
    commands = readme_commands()
    assert len(commands) >= 8
    assert any("results/paper/tables/ood.md" in c for c in commands)


@pytest.mark.parametrize("line", readme_commands())
@pytest.mark.slow
def test_a_readme_snakemake_command_parses_and_plans(line):
    from snakemake.cli import get_argument_parser

    argv = shlex.split(line)[1:]
    try:
        get_argument_parser().parse_args(argv)
    except SystemExit as err:  # argparse's verdict on the line as written
        pytest.fail(f"README: `{line}` does not parse ({err})")
    # a dry run of it (the report flags ask for an HTML report of finished results: left out here)
    dry = [a for a in argv if a != "--report-after-run"]
    if "--report" in dry:
        i = dry.index("--report")
        del dry[i:i + 2]
    if "-n" not in dry:
        dry.append("-n")
    proc = subprocess.run([str(BIN / "snakemake"), *dry], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(Path.home()), **PAPER_ENV})
    assert proc.returncode == 0, f"`{line}`:\n{(proc.stdout + proc.stderr)[-3000:]}"


def test_a_missing_local_copy_stops_the_dry_run(tmp_path):
    over = tmp_path / "local.yaml"
    over.write_text(f"grids:\n  paper:\n    datasets:\n      arc:\n        loader: arc\n"
                    f"        path: '{tmp_path}/arc-{{split}}.parquet'\n")
    proc = subprocess.run([str(BIN / "snakemake"), "--profile", "slurm", "-n", "--configfile", str(over)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(Path.home()), **PAPER_ENV})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "'grids.paper.datasets.arc.path'" in out and "arc-test.parquet does not exist" in out
