"""`softtokens audit --rerun`: re-execution as the final audit. An evaluation file is made again from what its
record says it was made from (its settings, its checkpoint or base model, its test set) in a scratch directory,
and the two are compared: every number and every per-problem row.

Why: the hashes a record holds are unkeyed. They catch an edit made without redoing them, a damaged file, a
swapped input; they cannot catch a forger who edits a row and redoes every hash, because anyone can compute a
sha256 (docs/reliability.md says what they do and do not protect). Running the evaluation again can: it gives the
numbers the checkpoint and data give, whatever the file says. Evaluation is deterministic on one kind of machine
(every row's randomness is seeded by its question and sample: engine.sampling), so a file made on this kind of
machine is compared bit for bit; one made on another (another GPU, another CPU vector unit) is reported with its
differences and why bit-equality is not expected there."""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path

from softtokens.run.provenance import _device, read_record

VARIES = ("seconds", "engine", "provenance")   # wall time, the engine's counters, the job's own record
RERUNS = "audit/reruns.jsonl"                  # under a grid's results: every re-execution's outcome (the report)


def _model_args(rec: dict) -> list[str]:
    inputs, leaves = rec.get("inputs") or {}, rec.get("external_inputs") or {}
    if "selected" in inputs:
        return ["--selected", inputs["selected"]["path"]]
    base = inputs.get("base_model") or leaves.get("base_model") or {}
    return ["--model", base.get("path") or base.get("id") or ""]


def remake(path: Path, scratch: Path) -> dict:
    """The evaluation file ``path`` made again, from its record, into ``scratch``: the new document (by the command
    its job ran, in a process of its own, as the job ran it)."""
    import subprocess
    import sys

    rec = read_record(path)
    if rec is None or rec.get("stage") not in ("evaluate", "evaluate_loglik"):
        raise ValueError(f"{path}: not an evaluation file with a record (stage {rec and rec.get('stage')})")
    out = scratch / path.name
    data = rec["inputs"]["data"]["path"]
    settings = {k: v for k, v in rec["config"].items() if k != "setting"}
    if rec["stage"] == "evaluate":
        argv = ["evaluate", "--settings", json.dumps(settings), "--setting", rec["config"]["setting"]]
    else:
        argv = ["evaluate-loglik", "--settings", json.dumps(settings)]
    proc = subprocess.run([sys.executable, "-m", "softtokens", *argv, *_model_args(rec), "--data", data, "--out",
                           str(out)], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{path}: the re-execution failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(out.read_text())


def differences(old: dict, new: dict) -> list[str]:
    """What the two documents say differently, less what varies from run to run (VARIES)."""
    out = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
           if k not in VARIES + ("problems",) and old.get(k) != new.get(k)]
    rows_old = {r.get("id"): r for r in old.get("problems") or []}
    rows_new = {r.get("id"): r for r in new.get("problems") or []}
    changed = [i for i in rows_old.keys() | rows_new.keys() if rows_old.get(i) != rows_new.get(i)]
    if changed:
        first = sorted(changed, key=str)[0]
        out.append(f"{len(changed)} problem row(s), first {first}: {rows_old.get(first)} -> {rows_new.get(first)}")
    return out


def rerun(path: Path) -> dict:
    """One file re-executed and compared: its outcome (appended to its grid's RERUNS)."""
    old = json.loads(path.read_text())
    made_on, here = (old.get("provenance") or {}).get("device") or {}, _device()
    same_kind = (made_on.get("kind"), made_on.get("name"), made_on.get("torch_cpu_capability")) == (
        here.get("kind"), here.get("name"), here.get("torch_cpu_capability"))
    with tempfile.TemporaryDirectory(prefix="softtokens-rerun-") as scratch:
        started = time.time()
        new = remake(path, Path(scratch))
    diff = differences(old, new)
    outcome = {"file": path.as_posix(), "equal": not diff, "differences": diff, "same_kind_of_machine": same_kind,
               "made_on": made_on.get("name"), "rerun_on": here.get("name"), "seconds": round(time.time() - started, 1),
               "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    parts = path.as_posix().split("/eval/")
    if len(parts) == 2:
        log = Path(parts[0]) / RERUNS
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as f:
            f.write(json.dumps(outcome) + "\n")
    return outcome


def files_to_rerun(a) -> list[Path]:
    """The evaluation files a `softtokens audit --rerun` re-executes: one file, one table cell's, or a seeded
    sample of a table's."""
    path = Path(a.path)
    if path.suffix == ".json" and "/eval/" in path.as_posix():
        return [path]
    if a.row is not None:
        from softtokens.audit.cell import cell_files

        return cell_files(path, a.row, a.column)
    rec = read_record(path) or {}
    evals = sorted(Path(i["path"]) for i in (rec.get("inputs") or {}).values() if "/eval/" in i["path"])
    if not a.rerun_sample:
        return evals
    return sorted(random.Random(a.seed).sample(evals, min(a.rerun_sample, len(evals))))


def cmd_rerun(a) -> int:
    files = files_to_rerun(a)
    if not files:
        raise SystemExit(f"{a.path}: no evaluation file to re-run (give an evaluation file, a table with --row and "
                         "--column, or a table with --rerun-sample N)")
    outcomes = []
    for f in files:
        print(f"re-running {f} ...", flush=True)
        o = rerun(f)
        outcomes.append(o)
        print(f"  {'EQUAL' if o['equal'] else 'DIFFERS'} ({o['seconds']} s)"
              + ("" if o["equal"] else "; " + "; ".join(o["differences"][:5])
                 + ("" if o["same_kind_of_machine"] else f" (made on {o['made_on']}, re-run on {o['rerun_on']}: "
                    "bit-equality is expected on the same kind of machine only)")))
    equal = sum(o["equal"] for o in outcomes)
    print(f"\n{len(outcomes)} evaluation file(s) re-run: {equal} equal, {len(outcomes) - equal} differ")
    return 0 if equal == len(outcomes) else 1
