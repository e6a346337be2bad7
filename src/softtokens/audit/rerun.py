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

import hashlib
import json
import secrets
import tempfile
import time
from pathlib import Path

from softtokens.store import paths
from softtokens.store.eval_identity import LOGLIK
from softtokens.store.files import read_json, read_jsonl, sha256_file
from softtokens.store.provenance import at_root, read_record, record_root

VARIES = ("seconds", "engine", "provenance")   # wall time, the engine's counters, the job's own record
RERUNS = paths.RERUNS                          # under a grid's results: every re-execution's outcome (the report)
LINE_HASH = "line_sha256"                      # each outcome's hash of itself (entry_sha256): an edit is told


def entry_sha256(outcome: dict) -> str:
    """The hash an outcome line of RERUNS holds of itself (less that hash)."""
    body = {k: v for k, v in outcome.items() if k != LINE_HASH}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def results_of(path: Path) -> Path:
    """{results} of an evaluation file {results}/eval/{model}/{trained}/{benchmark}/{file}."""
    return Path(path).parents[4]


def _base_model(path: Path, rec: dict, model: str) -> str:
    """The base model an evaluation of ``model``'s base reads: the grid's built base ({results}/models/MODEL) where
    there is one, else the hub id or local directory its record names."""
    built = results_of(path) / "models" / model
    if built.is_dir():
        return built.as_posix()
    root = record_root(path, rec)
    base = (rec.get("inputs") or {}).get("base_model") or (rec.get("external_inputs") or {}).get("base_model") or {}
    if base.get("path"):
        return at_root(root, base["path"]).as_posix()
    return base.get("id") or ""


def remake_args(path: Path, rec: dict) -> list[str]:
    """The command that makes the evaluation file at ``path`` again: what the path asks for (its setting, its run's
    selection or its model's base, its benchmark's test set), with the settings its record says its job was given
    (held to the current config by the audit). Never what the file's record names: a file copied over another,
    record and all, is made again as the file it claims to be and compared."""
    keys = paths.parse_eval_path(path)
    selected = paths.selection_of_eval(path)
    data = results_of(path) / "data" / keys["benchmark"] / "test.jsonl"
    model = ["--selected", selected.as_posix()] if selected is not None else [
        "--model", _base_model(path, rec, keys["model"])]
    settings = {k: v for k, v in (rec.get("config") or {}).items() if k != "setting"}
    if path.stem == LOGLIK:
        argv = ["evaluate-loglik", "--settings", json.dumps(settings)]
    else:
        argv = ["evaluate", "--settings", json.dumps(settings), "--setting", keys["setting"]]
    return [*argv, *model, "--model-name", keys["model"], "--benchmark", keys["benchmark"], "--data", data.as_posix()]


def remake(path: Path, scratch: Path) -> dict:
    """The evaluation file ``path`` made again into ``scratch`` (remake_args), in a process of its own as its job
    ran: the new document."""
    import subprocess
    import sys

    rec = read_record(path)
    if rec is None or rec.get("stage") not in ("evaluate", "evaluate_loglik"):
        raise ValueError(f"{path}: not an evaluation file with a record (stage {rec and rec.get('stage')})")
    out = scratch / path.name
    proc = subprocess.run([sys.executable, "-m", "softtokens", *remake_args(path, rec), "--out", str(out)],
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{path}: the re-execution failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return read_json(out)


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


def _machine(rec: dict) -> tuple:
    """What makes two runs bit-comparable: the kind of device, its name and (CPU) torch's vector capability, each as
    the evaluation job that ran recorded it (both sides read the same field of an evaluation's record)."""
    dev = rec.get("device") or {}
    return dev.get("kind"), dev.get("name"), dev.get("torch_cpu_capability")


def rerun(path: Path, sample_seed: int | None = None) -> dict:
    """One file re-executed and compared: its outcome (appended to its grid's RERUNS, hashed)."""
    old = read_json(path)
    with tempfile.TemporaryDirectory(prefix="softtokens-rerun-") as scratch:
        started = time.time()
        new = remake(path, Path(scratch))
    diff = differences(old, new)
    made_on, rerun_on = (old.get("provenance") or {}), (new.get("provenance") or {})
    outcome = {"file": _in_results(path), "file_sha256": sha256_file(path), "equal": not diff, "differences": diff,
               "same_kind_of_machine": _machine(made_on) == _machine(rerun_on),
               "made_on": (made_on.get("device") or {}).get("name"), "rerun_on": (rerun_on.get("device") or {}).get("name"),
               "rerun_code": rerun_on.get("git_commit"), "sample_seed": sample_seed,
               "seconds": round(time.time() - started, 1), "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    outcome[LINE_HASH] = entry_sha256(outcome)
    if "eval" in path.parts:
        log = results_of(path) / RERUNS
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as f:
            f.write(json.dumps(outcome) + "\n")
    return outcome


def _in_results(path: Path) -> str:
    """An evaluation file as the log names it: relative to its grid's results directory (eval/...), so that the log
    reads the same wherever the audit ran and the tree lies."""
    parts = Path(path).parts
    if "eval" not in parts:
        return Path(path).as_posix()
    i = len(parts) - 1 - parts[::-1].index("eval")
    return Path(*parts[i:]).as_posix()


def files_to_rerun(a) -> tuple[list[Path], int | None]:
    """The evaluation files a `softtokens audit --rerun` re-executes (one file, one table cell's, or a random sample
    of a table's: drawn with ``--seed``, else a fresh seed, printed and logged) and the sample's seed."""
    import random

    path = Path(a.path)
    if path.suffix == ".json" and "eval" in path.parts:
        return [path], None
    if a.row is not None:
        from softtokens.audit.cell import cell_files

        return cell_files(path, a.row, a.column), None
    rec = read_record(path) or {}
    root = record_root(path, rec)
    evals = sorted(at_root(root, i["path"]) for i in (rec.get("inputs") or {}).values() if "/eval/" in i["path"])
    if not a.rerun_sample:
        return evals, None
    seed = a.seed if a.seed is not None else secrets.randbits(32)
    return sorted(random.Random(seed).sample(evals, min(a.rerun_sample, len(evals)))), seed


def cmd_rerun(a) -> int:
    files, seed = files_to_rerun(a)
    if not files:
        raise SystemExit(f"{a.path}: no evaluation file to re-run (give an evaluation file, a table with --row and "
                         "--column, or a table with --rerun-sample N)")
    if seed is not None:
        print(f"--rerun-sample {a.rerun_sample}: drawn with seed {seed} (--seed {seed} draws the same files again)")
    outcomes = []
    for f in files:
        print(f"re-running {f} ...", flush=True)
        o = rerun(f, seed)
        outcomes.append(o)
        print(f"  {'EQUAL' if o['equal'] else 'DIFFERS'} ({o['seconds']} s)"
              + ("" if o["equal"] else "; " + "; ".join(o["differences"][:5])
                 + ("" if o["same_kind_of_machine"] else f" (made on {o['made_on']}, re-run on {o['rerun_on']}: "
                    "bit-equality is expected on the same kind of machine only)")))
    equal = sum(o["equal"] for o in outcomes)
    print(f"\n{len(outcomes)} evaluation file(s) re-run: {equal} equal, {len(outcomes) - equal} differ")
    return 0 if equal == len(outcomes) else 1


def rerun_log(results: Path) -> Path:
    return Path(results) / RERUNS


def holding_outcomes(log: Path) -> tuple[dict[str, dict], list[str]]:
    """The last outcome of each file in a RERUNS log that still holds (its line hashes to what it says, and it is
    about the file as it is now: the same sha256), and what was set aside, in words (edited lines, files re-run
    before they changed). Logged files are relative to the grid's results directory (the log's grandparent)."""
    rows = read_jsonl(log, while_written=True)
    last: dict[str, dict] = {}
    edited = 0
    for o in rows:
        if not isinstance(o, dict) or o.get(LINE_HASH) != entry_sha256(o):
            edited += 1
            continue
        last[o.get("file")] = o
    holding, older = {}, 0
    for f, o in last.items():
        here = at_root(log.parent.parent, f) if isinstance(f, str) else Path("")
        try:
            now = sha256_file(here)
        except OSError:
            now = None
        if now != o.get("file_sha256"):
            older += 1
            continue
        holding[f] = o
    said = []
    if edited:
        said.append(f"{edited} line(s) of {log} do not hash to what they say (edited after they were written): "
                    "not counted")
    if older:
        said.append(f"{older} file(s) re-run before they last changed: not counted")
    return holding, said
