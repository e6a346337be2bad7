"""The first day, on a laptop and on a cluster (docs/cluster.md, "Before the first job"): following the
README never breaks the suite, a cluster line stops before its first job where there is no cluster
or no data, the --forcerun order trap is caught, and every name mistake gets its file:line and the
closest valid name."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from test_workflow import BIN, PAPER_ENV, ROOT, TINY, job_counts, snakemake, tiny_args

from softtokens.data.sources import loader_kind
from softtokens.config.grids import ConfigError, check_config, read_config
from softtokens.config.text import check_yaml_syntax

TARGET = "results/paper/eval/llama-3b/gsm8k-fuzzy-seed2/math500/soft_sample.json"


def _copy_checkout(dest: Path) -> Path:
    """The repository's tracked files (what a fresh clone holds), without results or the venv."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / f).is_symlink():
            os.symlink(os.readlink(ROOT / f), dest / f)   # ./slurm -> profiles/slurm
        elif (ROOT / f).is_file():
            shutil.copy2(ROOT / f, dest / f)
    return dest


def _basic_tools(d: Path) -> Path:
    """A PATH directory with the shell tools Snakemake calls, and no SLURM command (CI installs SLURM in
    /usr/bin, so /usr/bin cannot be on this PATH)."""
    d.mkdir()
    for tool in ("sh", "bash", "which", "env", "uname", "git", "cat", "ls", "mkdir", "rm", "dirname", "readlink"):
        found = shutil.which(tool)
        if found:
            os.symlink(found, d / tool)
    return d


def _tiny_config(d: Path) -> None:
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    grid = {**config["grids"]["toy"], **TINY}
    config["grids"] = {"toy": grid}
    (d / "tiny.yaml").write_text(yaml.safe_dump(config))


@pytest.mark.slow
def test_a_generated_grid_changes_no_other_grid(tmp_path):
    """`softtokens plan --claims` (the README's step) writes grids/claims-*.yaml; the tiny DAG's config
    (another grid) plans as before: a grid file is read only when its grid is selected."""
    copy = _copy_checkout(tmp_path / "clone")
    proc = subprocess.run([str(BIN / "softtokens"), "plan", "--config", "config.yaml", "--claims", "passk_advantage"],
                          cwd=copy, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = list((copy / "grids").glob("claims-*.yaml"))
    assert written and "wrote grids/claims-" in proc.stdout
    work = tmp_path / "dag"
    work.mkdir()
    _tiny_config(work)
    dry = subprocess.run([str(BIN / "snakemake"), "-d", str(work), "-s", str(copy / "Snakefile"), "--configfile",
                          str(work / "tiny.yaml"), "-n", "--quiet", "rules"], cwd=copy, capture_output=True,
                         text=True, timeout=600)
    assert dry.returncode == 0, (dry.stdout + dry.stderr)[-3000:]
    # and the generated grid, selected, is read and planned
    name = written[0].stem
    dry = subprocess.run([str(BIN / "snakemake"), "--profile", "slurm", "-n", "--config", f"grid={name}", "--quiet",
                          "rules"], cwd=copy, capture_output=True, text=True, timeout=600, env={**os.environ, **PAPER_ENV})
    assert dry.returncode == 0 and "train" in dry.stdout + dry.stderr, (dry.stdout + dry.stderr)[-3000:]


def _cluster_line(tmp_path: Path, path: str, **env) -> subprocess.CompletedProcess:
    """The README's "One cell" cluster line, for real (no -n), in a fresh copy of the checkout (tmp_path/work)."""
    work = _copy_checkout(tmp_path / "work")
    return subprocess.run([str(BIN / "snakemake"), "--profile", "slurm", TARGET], cwd=work,
                          capture_output=True, text=True, timeout=300,
                          env={**{k: v for k, v in os.environ.items() if k != "PATH"}, **PAPER_ENV,
                               "PATH": path, **env})


def _stub_slurm(d: Path) -> Path:
    d.mkdir()
    for name in ("sbatch", "squeue", "scancel"):
        (d / name).write_text("#!/bin/sh\nexit 0\n")
        (d / name).chmod(0o755)
    return d


def test_a_cluster_line_where_there_is_no_slurm_stops_before_any_job(tmp_path):
    tools = _basic_tools(tmp_path / "bin")
    proc = _cluster_line(tmp_path, f"{BIN}{os.pathsep}{tools}")   # no sbatch, squeue or scancel on PATH
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    lines = [line for line in out.splitlines() if "SLURM is not here" in line]
    assert len(lines) == 1 and "sbatch, squeue, scancel not found" in lines[0], out[-3000:]
    assert not (tmp_path / "work" / "results" / "paper").exists()   # nothing left behind: no logs, no partial data


def test_a_cluster_line_with_no_hub_and_no_cached_data_stops_before_any_job(tmp_path):
    stubs = _stub_slurm(tmp_path / "slurm-bin")
    tools = _basic_tools(tmp_path / "bin")
    proc = _cluster_line(tmp_path, os.pathsep.join(map(str, (stubs, BIN, tools))), HF_HUB_OFFLINE="1",
                         HF_HOME=str(tmp_path / "hf"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "stopped before the first job" in out, out[-3000:]
    fetch = [line for line in out.splitlines() if "is not in the Hugging Face cache" in line]
    assert any(line.strip().startswith("datasets.gsm8k: dataset openai/gsm8k") for line in fetch), out[-3000:]
    assert all("hf download" in line for line in fetch)   # each with its fix, in one line
    # only what this cell needs (llama-3b trained on gsm8k, tested on math500): not the grid's every model and set
    named = sorted(line.strip().split(":")[0] for line in fetch)
    assert named == ["datasets.gsm8k", "datasets.math500", "models.llama-3b"], named
    assert "SLURM is not here" not in out
    assert 'File "' not in out and "Traceback" not in out, out[-2000:]   # the message alone, no traceback lines
    assert not (tmp_path / "work" / "results" / "paper").exists()


def test_a_dry_run_writes_no_report(tmp_path):
    """`snakemake --report FILE --report-after-run -n` plans, and leaves the HTML report as it was: bytes and
    modification time (Snakemake's CLI writes it after a dry run otherwise)."""
    report = tmp_path / "report.html"
    report.write_text("the report of an earlier run\n")
    os.utime(report, (1_000_000_000, 1_000_000_000))
    proc = snakemake(*tiny_args(_tiny(tmp_path)), "--cores", "2", "--report", str(report), "--report-after-run", "-n")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
    assert report.read_text() == "the report of an earlier run\n" and report.stat().st_mtime == 1_000_000_000
    assert "a dry run writes nothing" in proc.stdout + proc.stderr


def test_a_dry_run_says_what_a_real_run_would_refuse(tmp_path):
    tools = _basic_tools(tmp_path / "bin")
    proc = snakemake("--profile", "slurm", "-n", TARGET, "--quiet", "rules",
                     env={**PAPER_ENV, "PATH": f"{BIN}{os.pathsep}{tools}", "HF_HOME": str(tmp_path / "hf")})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "a real run would stop before its first job" in out and "SLURM is not here" in out


def test_the_forcerun_order_trap_is_caught_before_any_job(tmp_path):
    proc = snakemake(*tiny_args(_tiny(tmp_path)), "-n", "--forcerun", "evaluate", "results/toy/tables/main.md")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Put the target first: snakemake results/toy/tables/main.md --forcerun evaluate" in out, out[-2000:]


CELL = "results/toy/eval/toy/base/toyarith/hard_greedy.json"


@pytest.mark.parametrize("words", [
    [CELL, "--forcerun", CELL],            # the target first, the file forced: Snakemake's own form
    pytest.param(["-R", CELL], marks=pytest.mark.slow),                       # a file forced, the default target
    pytest.param([CELL, "--forcerun", "evaluate"], marks=pytest.mark.slow),   # a rule forced after a target
])
def test_valid_forcerun_forms_run_as_snakemake_runs_them(tmp_path, words):
    proc = snakemake(*words, *tiny_args(_tiny(tmp_path)), "-n")
    assert proc.returncode == 0 and "Put the target first" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert job_counts(proc).get("evaluate", 0) >= 1


def test_the_forcerun_trap_refuses_only_a_swallowed_target():
    from softtokens.workflow.startup import RULES, forcerun_trap

    assert forcerun_trap(["evaluate", CELL], RULES) and "snakemake " + CELL + " --forcerun evaluate" in \
        forcerun_trap(["evaluate", CELL], RULES)
    assert forcerun_trap([CELL], RULES) is None                       # -R FILE
    assert forcerun_trap([CELL], RULES, targets=[CELL]) is None       # TARGET --forcerun TARGET
    assert forcerun_trap(["evaluate", CELL], RULES, targets=["results/toy/tables/main.md"]) is None
    assert forcerun_trap(["evaluate", "main_table"], RULES) is None   # rules only


def _tiny(tmp_path: Path) -> Path:
    d = tmp_path / "tiny"
    d.mkdir()
    _tiny_config(d)
    return d


def _mistake(tmp_path: Path, old: str, new: str) -> Path:
    text = (ROOT / "config.yaml").read_text()
    assert old in text
    p = tmp_path / "config.yaml"
    p.write_text(text.replace(old, new, 1))
    return p


@pytest.mark.parametrize("old,new,said", [
    ("      - model: toy\n        dataset: toyarith\n", "      - model: toyy\n        dataset: toyarith\n",
     "'grids.toy.training.0.model': unknown model 'toyy' (did you mean 'toy'?"),
    ("      - model: toy\n        dataset: toyarith\n", "      - model: toy\n        dataset: toyarithm\n",
     "'grids.toy.training.0.dataset': unknown dataset 'toyarithm' (did you mean 'toyarith'?"),
    ("      - model: toy\n        dataset: toyarith\n", "      - model: toy\n        dataset: gsm8k\n",
     "'gsm8k' is a dataset of grid paper: add it to this grid's datasets"),
    ("        modes: [hard, soft, fuzzy]\n", "        modes: [hard, sfot, fuzzy]\n",
     "'sfot' is not one of ['hard', 'soft', 'fuzzy']; did you mean 'soft'?"),
])
def test_a_name_mistake_in_a_grid_is_named_with_its_line_and_the_closest_name(tmp_path, old, new, said):
    p = _mistake(tmp_path, old, new)
    with pytest.raises(ConfigError) as err:
        config, files = read_config(p)
        check_config(config, loader_kind, files)
    assert said in str(err.value)
    assert f"{p}:" in str(err.value)   # the file and the line


def test_an_unclosed_bracket_is_named_where_it_opens(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("grid: toy\nrl: {lr: 1.0e-3\nsteps: 4\nother: 1\n")
    with pytest.raises(ConfigError) as err:
        check_yaml_syntax(p)
    assert f"{p}:2:5: not valid YAML" in str(err.value) and "noticed at line" in str(err.value)


def test_an_unclosed_quote_is_named_on_its_own_line_not_the_mapping_above(tmp_path):
    """The parser's context is the block mapping that holds the quote (two lines above it, in config.yaml's toy
    grid); the quote's own line is where the mistake is."""
    lines = (ROOT / "config.yaml").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "validation_size: 128")
    lines[at] = lines[at].replace("128", '"128')
    p = tmp_path / "config.yaml"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as err:
        check_yaml_syntax(p)
    assert f"{p}:{at + 1}:" in str(err.value), str(err.value)
    # an apostrophe inside a word, a comment's quote and a bracket closed on a later line are not openings
    q = tmp_path / "ok.yaml"
    q.write_text("a: the paper's prompt  # it's fine\nb: [1,\n    2]\nc: 'x'' y'\nd: {e: \"unclosed\n")
    with pytest.raises(ConfigError) as err:
        check_yaml_syntax(q)
    assert f"{q}:5:8:" in str(err.value), str(err.value)


def test_a_misspelled_hub_id_in_plan_names_its_line_and_the_id(tmp_path):
    p = _mistake(tmp_path, "source: meta-llama/Llama-3.2-3B-Instruct", "source: meta-llama/Llama-3.2-3B-Instrcut")
    proc = subprocess.run([str(BIN / "softtokens"), "plan", "--config", str(p), "--grid", "paper"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "did you mean 'meta-llama/Llama-3.2-3B-Instruct'?" in proc.stderr and f"{p}:" in proc.stderr


@pytest.mark.parametrize("target,said", [
    ("results/toy/eval/toy/toyarith-sfot-seed0/toyarith/hard_greedy.json", "mode 'sfot' is not one of this grid's (did you mean 'soft'?)"),
    pytest.param("results/toy/eval/toy/toyarith-fuzzy-seed0/toyarith/hard_greddy.json",
                 "setting 'hard_greddy' is not evaluated here (did you mean 'hard_greedy'?)", marks=pytest.mark.slow),
    pytest.param("results/toy/runs/toy/toyarth/soft/seed0/selected.json",
                 "toy/toyarth is not a training cell of the grid (did you mean 'toy/toyarith'?", marks=pytest.mark.slow),
])
def test_a_name_mistake_in_a_target_is_named_before_any_job(tmp_path, target, said):
    proc = snakemake(*tiny_args(_tiny(tmp_path)), "-n", target)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and said in out, out[-2000:]


@pytest.mark.slow
def test_the_startup_check_knows_every_rule_of_the_workflow():
    from softtokens.workflow.startup import RULES

    listed = set()
    # the toy grid's rules, and the paper grid's (evaluate_loglik is a rule where each job evaluates one setting)
    for extra in ((), ("--config", "grid=paper")):
        proc = snakemake("--list-rules", *extra, env={"HF_HUB_OFFLINE": "1"})
        listed |= {line.split()[0] for line in proc.stdout.splitlines() if line.strip() and not line.startswith(" ")}
    assert listed == RULES, listed ^ RULES


def test_an_interrupted_note_waits_for_the_lock(tmp_path, monkeypatch):
    from softtokens.workflow.startup import locked

    monkeypatch.chdir(tmp_path)
    assert not locked()
    (tmp_path / ".snakemake" / "locks").mkdir(parents=True)
    (tmp_path / ".snakemake" / "locks" / "0.input.lock").write_text("x")
    assert locked()   # another Snakemake is writing: its outputs are not left incomplete


@pytest.mark.parametrize("argv, lists_only", [
    (["--list-rules"], True), (["--dag"], True), (["--summary"], True), (["--unlock"], True),
    (["--report", "r.html"], True),
    (["--report", "r.html", "--report-after-run"], False), (["-n"], False), ([], False), (["all"], False),
])
def test_a_command_that_runs_no_job_skips_the_pre_flight_refusals(argv, lists_only):
    """`--list-rules` on the paper grid, on a laptop, lists the rules (CI at 6921a81 saw it stopped by the memory
    check meant for runs); a run, dry or real, keeps the check."""
    from snakemake.cli import parse_args
    from softtokens.workflow.startup import runs_no_job

    assert runs_no_job(parse_args(argv)[1]) is lists_only
