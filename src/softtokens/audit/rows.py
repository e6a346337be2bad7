"""An evaluation file's numbers recomputed from its own per-problem rows: pass@1 and every pass@k of
a math file from each problem's (samples, correct); the accuracy and the NLL of the correct answer of
an out-of-domain file from each question's.

Why: a table cell is a mean of these numbers, and a number typed over one (or a file whose rows and
summary disagree for any other reason) would otherwise pass every check that reads the summary only.
Rows and summary are written by one function in one job; they agree to the last bit, so any
difference beyond rounding is an edit."""

from __future__ import annotations

import json

from pathlib import Path

from softtokens.eval.metrics import mean_pass_at_k
from softtokens.run.files import read_jsonl
from softtokens.train.selection import select_best

TOLERANCE = 1e-9   # the summary is computed from the rows in the same order: only an edit moves it


def _differs(recorded, recomputed) -> bool:
    return not isinstance(recorded, (int, float)) or abs(float(recorded) - recomputed) > TOLERANCE


def math_problems(path: Path, doc: dict) -> list[str]:
    rows, n = doc.get("problems"), doc.get("n_samples")
    if not rows:
        return [f"NO ROWS {path}: no per-problem results to recompute its numbers from"]
    out = []
    if doc.get("n_problems", len(rows)) != len(rows):
        out.append(f"EDITED {path}: n_problems says {doc['n_problems']}, it holds {len(rows)} problems")
    bad = [r.get("id") for r in rows if r.get("n") != n or not 0 <= r.get("correct", -1) <= r.get("n", 0)]
    if bad:
        out.append(f"EDITED {path}: {len(bad)} problem(s) whose counts are not 0..{n} correct of {n} samples "
                   f"(first: {bad[0]})")
        return out
    counts = [(r["n"], r["correct"]) for r in rows]
    now = mean_pass_at_k(counts, 1)
    if _differs(doc.get("pass@1"), now):
        out.append(f"EDITED {path}: pass@1 says {doc.get('pass@1')}, its {len(rows)} problems give {now:.6g}")
    for k, value in (doc.get("pass@k") or {}).items():
        if not 1 <= int(k) <= n:
            out.append(f"EDITED {path}: pass@{k} with {n} samples per problem")
            continue
        now = mean_pass_at_k(counts, int(k))
        if _differs(value, now):
            out.append(f"EDITED {path}: pass@{k} says {value}, its {len(rows)} problems give {now:.6g}")
    return out


def loglik_problems(path: Path, doc: dict) -> list[str]:
    rows = doc.get("problems")
    if not rows:
        return [f"NO ROWS {path}: no per-question results to recompute its numbers from"]
    out = []
    if doc.get("n_problems") != len(rows):
        out.append(f"EDITED {path}: n_problems says {doc.get('n_problems')}, it holds {len(rows)} questions")
    correct = [bool(r["correct"] if "correct" in r else r.get("pred") == r.get("label")) for r in rows]
    now = sum(correct) / len(rows)
    if _differs(doc.get("accuracy"), now):
        out.append(f"EDITED {path}: accuracy says {doc.get('accuracy')}, its {len(rows)} questions give {now:.6g}")
    nll = [r.get("nll_correct") for r in rows]
    if all(isinstance(x, (int, float)) for x in nll):
        now = sum(nll) / len(rows)
        if _differs(doc.get("nll_correct"), now):
            out.append(f"EDITED {path}: nll_correct says {doc.get('nll_correct')}, its {len(rows)} questions give "
                       f"{now:.6g}")
    return out


def row_problems(path: Path, doc: dict) -> list[str]:
    """Every number of an evaluation file that does not follow from its rows (empty: all do)."""
    return loglik_problems(path, doc) if Path(path).stem == "loglik" else math_problems(path, doc)


def selection_problems(path: Path, doc: dict, rec: dict) -> list[str]:
    """A run's selection (selected.json) against the metrics it was chosen from: the step, its greedy
    validation accuracy (the number a hyperparameter search's table reads: report.sweeps), the base's and
    the failed-to-learn verdict follow from the validation rows by train.selection.select_best, or were
    edited (a forger who rehashed the document passes its content hash, not this)."""
    metrics = Path(((rec.get("inputs") or {}).get("metrics") or {}).get("path", ""))
    if not metrics.is_file():
        return [f"MISSING {metrics}: the metrics {path} was selected from"] if metrics.name else []
    try:
        now = select_best(read_jsonl(metrics))
    except (ValueError, KeyError) as err:
        return [f"EDITED {metrics}: no selection follows from its rows ({err})"]
    out = []
    # the base's score and the failed-to-learn verdict where the file has them (selections made before those
    # were recorded lack them, and are not edits for it)
    keys = ("step", "val_greedy_accuracy",
            *(k for k in ("base_val_greedy_accuracy", "failed_to_learn", "val_correct") if k in doc or k in now))
    for key in keys:
        if doc.get(key) != now[key]:
            out.append(f"EDITED {path}: {key} says {doc.get(key)!r}, the validation rows of {metrics} give "
                       f"{now[key]!r}")
    return out


def shared_selection_problems(path: Path, doc: dict) -> list[str]:
    """A shared selection (a run that is another's name: run.identity) against the run it shares: that run computes
    what this name asks for (train.selection.share_problem), and what it says is that run's selection."""
    from softtokens.train.selection import SHARED_WITH, share_problem

    problem = share_problem(path)
    if problem:
        return [f"NOT THE SAME RUN: {problem}"]
    other = Path(doc[SHARED_WITH]) / path.name
    theirs = json.loads(other.read_text())
    return [f"EDITED {path}: {key} says {doc.get(key)!r}, the run it shares ({other}) {theirs.get(key)!r}"
            for key in ("step", "val_greedy_accuracy", "checkpoint", "failed_to_learn") if doc.get(key) != theirs.get(key)]
