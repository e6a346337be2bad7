"""The two README commands timed as a new user meets them: each in a fresh clone of the repository's HEAD (set-up
included: the .venv, CPU torch, the project), on this machine, one after the other so that neither slows the other.

    python benchmarks/fresh_clone_time.py            # both: writes benchmarks/results/{demo,test}_time.json
    python benchmarks/fresh_clone_time.py --only test
    python benchmarks/fresh_clone_time.py --only test --slow   # then `make test-slow` in the same clone

`make test` runs with pytest's --durations=0 (PYTEST_ADDOPTS), so its time splits by kind of test, each module
counted whole under one kind (KINDS; a module that starts `snakemake` is a DAG test): the README's statement of the
split is generated from test_time.json (softtokens docs --write). The seconds of a kind are pytest's own per-test
times summed over the workers, so they add up to more than the wall time when workers run side by side.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# module -> kind, before the rule that a module starting `snakemake` is a DAG test; every other module is a unit test
KINDS = {"test_slurm.py": "SLURM", "test_real_model.py": "real model"}
ORDER = ("unit", "DAG", "SLURM", "real model")
DURATION = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(tests/[^:]+)::")


def kind_of(module: str) -> str:
    if module in KINDS:
        return KINDS[module]
    text = (ROOT / "tests" / module).read_text()
    return "DAG" if "snakemake(" in text else "unit"


def module_seconds(log: str) -> dict[str, float]:
    """pytest --durations=0 lines -> seconds per test module (setup, call and teardown summed)."""
    out = defaultdict(float)
    for line in log.splitlines():
        m = DURATION.match(line)
        if m:
            out[Path(m.group(3)).name] += float(m.group(1))
    return out


def split_by_kind(log: str) -> dict[str, float]:
    """Seconds per kind of test (kind_of each module)."""
    out = defaultdict(float)
    for module, seconds in module_seconds(log).items():
        out[kind_of(module)] += seconds
    return {k: round(out[k], 1) for k in ORDER if k in out}


def slowest_modules(log: str, n: int = 8) -> dict[str, float]:
    """The ``n`` modules with the most seconds."""
    return {k: round(v, 1) for k, v in sorted(module_seconds(log).items(), key=lambda kv: -kv[1])[:n]}


def timed_make(target: str, env: dict | None = None, then: str | None = None
               ) -> tuple[float, str, dict, tuple[float, str, int] | None]:
    """(seconds, output, the demo's table numbers, (seconds, output, exit status) of `make THEN` after it in the same
    clone, set-up done) of `make TARGET` in a fresh clone (a failed TARGET stops here; a failed THEN is returned)."""
    with tempfile.TemporaryDirectory(prefix=f"fresh-{target}-") as tmp:
        clone = Path(tmp) / "softtokens"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        runs = []
        for t in (target, then) if then else (target,):
            start = time.monotonic()
            proc = subprocess.run(["make", t], cwd=clone, capture_output=True, text=True,
                                  env={**os.environ, **(env or {})})
            seconds = time.monotonic() - start
            log = Path(tempfile.gettempdir()) / f"fresh-make-{t}.log"
            log.write_text(proc.stdout + proc.stderr)
            print(f"make {t}: {seconds:.0f} s, exit {proc.returncode}; its output: {log}")
            if proc.returncode != 0:
                print(f"make {t} failed in a fresh clone ({seconds:.0f} s):\n{(proc.stdout + proc.stderr)[-4000:]}")
                if t == target:
                    sys.exit(1)
            runs.append((seconds, proc.stdout + proc.stderr, proc.returncode))
        return runs[0][0], runs[0][1], demo_numbers(clone), runs[1] if then else None


def counted(log: str) -> dict[str, int]:
    """pytest's closing counts (passed, skipped) in a make log."""
    return {what: int(m.group(1)) if (m := re.search(rf"(\d+) {what}", log)) else 0 for what in ("passed", "skipped")}


def host_kind() -> str:
    """The kind of host a timing is of: its CPU model and vector unit (the two kinds this project is built and tested on
    differ 2x in a job's time: a Xeon with AVX-512, an AMD EPYC with AVX2), and its cores."""
    model, flags = "unknown CPU", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1]
    except OSError:
        pass
    vector = "AVX-512" if "avx512f" in flags.split() else "AVX2" if "avx2" in flags.split() else "no AVX2"
    return f"{model}, {vector}, {os.cpu_count()} cores"


def demo_numbers(clone: Path) -> dict:
    """The demo's main and out-of-domain tables as it printed them (README's sentence about the toy's results is
    generated from these, dated and named by host: one host's floats are not another's)."""
    out = {}
    for table in ("main", "ood"):
        path = clone / "results" / "toy" / "tables" / f"{table}.csv"
        if path.is_file():
            import csv

            out[table] = list(csv.DictReader(path.read_text().splitlines()))
    return out


def head() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def record(name: str, doc: dict) -> None:
    """This host kind's measurement in RESULTS/name, beside the other kinds' (the README names each)."""
    path = RESULTS / name
    hosts = json.loads(path.read_text()).get("hosts", {}) if path.is_file() else {}
    hosts[doc["host"]] = doc
    path.write_text(json.dumps({"hosts": hosts}, indent=1) + "\n")
    print(f"{path.relative_to(ROOT)}: {json.dumps(doc)[:400]}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=("demo", "test"))
    p.add_argument("--slow", action="store_true", help="after `make test`, `make test-slow` in the same clone")
    a = p.parse_args(argv)
    stamp = {"date": dt.date.today().isoformat(), "commit": head(), "host": host_kind()}
    if a.only in (None, "demo"):
        seconds, _, numbers, _ = timed_make("demo")
        record("demo_time.json", {"seconds": round(seconds), **stamp, "tables": numbers,
                                  "how": "make demo in a fresh clone, set-up included (benchmarks/fresh_clone_time.py)"})
    if a.only in (None, "test"):
        env = {"PYTEST_ADDOPTS": "--durations=0"}
        seconds, log, _, slow = timed_make("test", env, then="test-slow" if a.slow else None)
        doc = {"seconds": round(seconds), **stamp, **counted(log), "tier": "make test (every test not marked slow)",
               "kinds": split_by_kind(log), "slowest_modules": slowest_modules(log),
               "how": "make test in a fresh clone, set-up included; kinds: pytest's per-test "
                      "seconds summed over the workers (benchmarks/fresh_clone_time.py)"}
        if slow is not None and slow[2] == 0:
            doc["slow"] = {"seconds": round(slow[0]), "date": stamp["date"], "commit": stamp["commit"],
                           **counted(slow[1]), "kinds": split_by_kind(slow[1]),
                           "slowest_modules": slowest_modules(slow[1]),
                           "how": "make test-slow after make test, in the same clone (set-up done)"}
        else:   # make test alone, or a make test-slow that failed: this host's last passing make test-slow stays,
            #     with its own date and commit (a failed run's time is no measurement of the tier)
            path = RESULTS / "test_time.json"
            before = json.loads(path.read_text()).get("hosts", {}).get(stamp["host"], {}) if path.is_file() else {}
            if "slow" in before:
                doc["slow"] = {"date": before["date"], "commit": before["commit"], **before["slow"]}
        record("test_time.json", doc)   # make test's time, kept though make test-slow failed after it
        if slow is not None and slow[2] != 0:
            sys.exit("make test-slow failed: its time is not recorded")


if __name__ == "__main__":
    main()
