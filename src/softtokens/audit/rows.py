"""An evaluation file's numbers recomputed from its own per-problem rows: pass@1 and every pass@k of
a math file from each problem's (samples, correct); the accuracy and the NLL of the correct answer of
an out-of-domain file from each question's.

Why: a table cell is a mean of these numbers, and a number typed over one (or a file whose rows and
summary disagree for any other reason) would otherwise pass every check that reads the summary only.
Rows and summary are written by one function in one job; they agree to the last bit, so any
difference beyond rounding is an edit."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from softtokens.eval.metrics import mean_pass_at_k
from softtokens.store.files import MalformedFile, read_json, read_jsonl
from softtokens.store.provenance import at_root
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
    out += stored_answer_problems(path, rows)
    correct = [r.get("pred") == r.get("label") for r in rows]   # from what was answered, not the row's own word
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


LOGLIK_ROUNDING = 1e-5   # the per-option log-likelihoods are stored to 5 decimals (eval.loglik.score_rows)


def stored_answer_problems(path: Path, rows: list[dict]) -> list[str]:
    """An out-of-domain question's verdicts against what it stores: `correct` is `pred == label`; the cloze
    prediction the option of highest stored log-likelihood; the NLL of the correct answer its stored log-likelihood
    over its tokens. A row whose `correct` was flipped (its file rehashed: the hash is unkeyed) fails here."""
    out = []
    for r in rows:
        qid, ll, n = r.get("id"), r.get("loglik"), r.get("n_tokens")
        if "correct" in r and bool(r["correct"]) != (r.get("pred") == r.get("label")):
            out.append(f"EDITED {path}: question {qid} says correct={r['correct']}, but it answered {r.get('pred')!r} "
                       f"to a gold {r.get('label')!r}")
        if not (isinstance(ll, list) and isinstance(n, list) and len(ll) == len(n) and ll):
            continue
        label, cloze = r.get("label"), r.get("pred_cloze", r.get("pred"))
        if isinstance(cloze, int) and 0 <= cloze < len(ll) and ll[cloze] < max(ll) - 2 * LOGLIK_ROUNDING:
            out.append(f"EDITED {path}: question {qid}'s cloze prediction {cloze} is not its option of highest "
                       f"stored log-likelihood ({ll.index(max(ll))})")
        if isinstance(label, int) and 0 <= label < len(ll) and isinstance(r.get("nll_correct"), (int, float)) \
                and abs(r["nll_correct"] + ll[label] / n[label]) > 2 * LOGLIK_ROUNDING:
            out.append(f"EDITED {path}: question {qid}'s nll_correct {r['nll_correct']:.6g} is not its stored "
                       f"log-likelihood over its tokens ({-ll[label] / n[label]:.6g})")
    return out


@lru_cache(maxsize=64)
def _test_ids(path: str, signature: tuple) -> tuple[str, ...]:
    rows = read_jsonl(Path(path))
    unnamed = next((i for i, r in enumerate(rows, 1) if not isinstance(r, dict) or "id" not in r), None)
    if unnamed is not None:
        raise ValueError(f"{path}:{unnamed}: a row without an id")
    return tuple(r["id"] for r in rows)


def test_set_problems(path: Path, doc: dict, rec: dict, root: Path | None = None) -> list[str]:
    """An evaluation's rows against its test set (the data file its record names): every question once, none
    added, none dropped (a file whose wrong answers were cut, its summary recomputed, passed every other check)."""
    recorded = ((rec.get("inputs") or {}).get("data") or {}).get("path", "")
    data = at_root(root, recorded) if recorded else Path("")
    if not data.is_file():
        return []   # the chain's MISSING names it
    st = data.stat()
    try:
        want = _test_ids(data.as_posix(), (st.st_size, st.st_mtime_ns))
    except ValueError as err:   # not a question set: the rows cannot be held against it, which is a problem too
        return [f"EDITED {path}: its test set {recorded} cannot be read as questions ({err})"]
    got = [r.get("id") for r in doc.get("problems") or []]
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    twice = sorted({i for i in got if got.count(i) > 1}) if len(set(got)) != len(got) else []
    if not (missing or extra or twice):
        return []
    said = "; ".join(f"{what} {len(ids)} ({', '.join(map(str, ids[:3]))}{', ...' if len(ids) > 3 else ''})"
                     for what, ids in (("missing", missing), ("not in it", extra), ("twice", twice)) if ids)
    return [f"EDITED {path}: its rows are not its test set {recorded} ({len(want)} questions): {said}"]


def row_problems(path: Path, doc: dict, rec: dict | None = None, root: Path | None = None) -> list[str]:
    """Every number of an evaluation file that does not follow from its rows, and its rows against its test set
    (empty: all hold). ``root``: what the record's paths are relative to (store.provenance.record_root)."""
    try:
        out = loglik_problems(path, doc) if Path(path).stem == "loglik" else math_problems(path, doc)
    except (TypeError, KeyError, AttributeError, ValueError) as err:   # a row of the wrong shape: named, not a traceback
        return [f"MALFORMED {path}: its rows are not an evaluation's ({type(err).__name__}: {err})"]
    return out + (test_set_problems(path, doc, rec, root) if rec else [])


def selection_problems(path: Path, doc: dict, rec: dict, root: Path | None = None) -> list[str]:
    """A run's selection (selected.json) against the metrics it was chosen from: the step, its greedy
    validation accuracy (the number a hyperparameter search's table reads: report.sweeps), the base's and
    the failed-to-learn verdict follow from the validation rows by train.selection.select_best, or were
    edited (a forger who rehashed the document passes its content hash, not this)."""
    recorded = ((rec.get("inputs") or {}).get("metrics") or {}).get("path", "")
    metrics = at_root(root, recorded) if recorded else Path("")
    if not metrics.is_file():
        return [f"MISSING {recorded}: the metrics {path} was selected from"] if recorded else []
    try:
        now = select_best(read_jsonl(metrics))
    except (ValueError, KeyError, TypeError) as err:
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


def shared_selection_problems(path: Path, doc: dict, root: Path | None = None) -> list[str]:
    """A shared selection (a run that is another's name: grid.identity) against the run it shares: that run computes
    what this name asks for (train.selection.share_problem), and what it says is that run's selection."""
    from softtokens.train.selection import SHARED_WITH, share_problem

    problem = share_problem(path)
    if problem:
        return [f"NOT THE SAME RUN: {problem}"]
    other = at_root(root, doc[SHARED_WITH]) / path.name
    try:
        theirs = read_json(other)
    except MalformedFile as err:
        return [f"MALFORMED {err}"]
    return [f"EDITED {path}: {key} says {doc.get(key)!r}, the run it shares ({other}) {theirs.get(key)!r}"
            for key in ("step", "val_greedy_accuracy", "checkpoint", "failed_to_learn") if doc.get(key) != theirs.get(key)]


def fingerprint(doc: dict) -> tuple | None:
    """What a copy of an evaluation file shares with its original and an honestly made file of another seed does
    not: its stored continuous values (each question's option log-likelihoods and NLL out of domain; the CoT
    entropy by position, each problem's mean CoT length and the examples' text for math). None where the file
    stores none: its argmax answers or correct flags alone are never evidence of a copy (every model at ceiling
    answers every question alike, and the demo once refused three honest seeds for it)."""
    rows = doc.get("problems") or []
    if rows and all(isinstance(r.get("loglik"), list) for r in rows):
        return ("loglik", tuple((r.get("id"), tuple(r["loglik"]), r.get("nll_correct")) for r in rows))
    entropy = doc.get("entropy_profile") or []
    lengths = tuple(r.get("mean_cot_length") for r in rows)
    if not entropy and all(x is None for x in lengths):
        return None
    texts = tuple((e.get("cot"), e.get("completion")) for e in doc.get("examples") or [])
    return ("math", tuple(entropy), lengths, texts)


def _weights_sha256(doc: dict, root: Path | None) -> str | None:
    """The sha256 of the weights an evaluation of a trained run was made from, from its checkpoint's manifest
    (None: a base model, or a checkpoint no longer there)."""
    from softtokens.model.checkpoint import TrainerState

    ckpt = ((doc.get("provenance") or {}).get("inputs") or {}).get("checkpoint") or {}
    where = at_root(root, ckpt["path"]) if ckpt.get("path") else None
    if where is None or not TrainerState.exists(where):
        return None
    try:
        files = TrainerState.read(where).files
    except (OSError, ValueError, TypeError):
        return None
    weights = {n: e for n, e in files.items() if n.endswith(".safetensors")}
    return "|".join(f"{n}:{(e or {}).get('sha256') if isinstance(e, dict) else e}" for n, e in sorted(weights.items()))


def identical_seed_problems(paths: list[Path]) -> list[str]:
    """Evaluation files of two seeds of one run (the same model, training, benchmark and setting) that store the same
    continuous values (fingerprint): one file copied over the other. Seeds are trained apart, so their log-likelihoods
    and entropies differ in their last bits even where every answer agrees. Two seeds whose checkpoints hold the
    same weights (a run that never updated: every reward equal) give the same file honestly: not flagged."""
    from softtokens.store.paths import parse_eval_path
    from softtokens.store.provenance import record_root

    groups: dict[tuple, list[Path]] = {}
    for p in map(Path, paths):
        try:
            keys = parse_eval_path(p)
        except (ValueError, IndexError):
            continue
        if keys["train_mode"] != "none" and p.suffix == ".json":
            groups.setdefault(tuple(v for k, v in keys.items() if k != "seed"), []).append(p)
    out = []
    for files in groups.values():
        if len(files) < 2:
            continue
        seen: dict[tuple, tuple[Path, str | None]] = {}
        for p in sorted(files):
            try:
                doc = read_json(p)
            except MalformedFile:
                continue   # named by the file's own checks
            values = fingerprint(doc)
            if values is None:
                continue
            weights = _weights_sha256(doc, record_root(p, doc.get("provenance") or {}))
            if values in seen:
                first, first_weights = seen[values]
                if weights is None or weights != first_weights:
                    out.append(f"IDENTICAL SEEDS {p}: it stores the same log-likelihoods, entropies and lengths as "
                               f"{first}, another seed's file, to the last bit (a copy?)")
                continue
            seen[values] = (p, weights)
    return out
