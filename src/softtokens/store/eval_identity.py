"""What an evaluation file is, written in its hashed content by the job that made it, and held to where it lies.

Why: the tables read a file's setting, run and benchmark off its path (store.paths), and nothing tied the file to
them: `cp hard_sample.json hard_greedy.json` moved a Table 1 cell from 96.5 ± 0.6 to 75.1 ± 30.8 and every check
passed, the re-run included (it re-executed what the copied record named). Now each evaluation document carries its
identity (IDENTITY: model, trained run or base, benchmark, inference setting with its parameters, the test set's
hash and question ids), made from what the job read and ran, not from its output path; the table jobs, `softtokens
status` and the audit hold it to the path (identity_problems) and refuse a file that is another's, naming both.
A forger who edits the identity too must keep the document self-consistent (a greedy setting draws one sample per
question; the setting's parameters are the document's own) and redo its hash; `softtokens audit --rerun`
re-executes what the path asks for, whatever the file says."""

from __future__ import annotations

import hashlib
from pathlib import Path

from softtokens.store import paths
from softtokens.config.names import SETTING_NAMES, is_sampled, setting_mode

IDENTITY = "identity"
LOGLIK = "loglik"            # the out-of-domain file's stem and its identity's setting
SETTING_FIELDS = ("mode", "temperature", "noise_factor", "noise_placement", "noise_top_k")


def ids_sha256(ids: list) -> str:
    """The hash of a test set's question ids in order (what an evaluation was run on, besides the file's bytes)."""
    return hashlib.sha256("\n".join(map(str, ids)).encode()).hexdigest()


def trained_identity(selected: str | Path | None) -> dict | str:
    """The trained run behind a selection file (its run directory: model, training set, mode, variant, seed), or
    "base" for a base model (``selected`` None)."""
    if selected is None:
        return "base"
    keys = paths.parse_run_path(Path(selected))
    return {"model": keys["model"], "dataset": keys["train_dataset"], "mode": keys["train_mode"],
            "variant": keys["variant"], "seed": keys["seed"]}


def eval_identity(model: str, trained: dict | str, benchmark: str, setting: str, setting_params: dict,
                  data_sha256: str, ids: list) -> dict:
    """An evaluation document's IDENTITY block (module docstring)."""
    return {"model": model, "trained": trained, "benchmark": benchmark, "setting": setting,
            "setting_params": setting_params,
            "test_set": {"sha256": data_sha256, "n": len(ids), "ids_sha256": ids_sha256(ids)}}


def expected_identity(path: str | Path) -> dict:
    """What the layout says the file at ``path`` is: model, trained ("base" or the run's keys), benchmark, setting."""
    keys = paths.parse_eval_path(path)
    run = paths.eval_run(keys)
    trained = "base" if run is None else {"model": run.model, "dataset": run.dataset, "mode": run.mode,
                                          "variant": run.variant, "seed": run.seed}
    return {"model": keys["model"], "trained": trained, "benchmark": keys["benchmark"], "setting": keys["setting"]}


def _said(trained) -> str:
    if trained == "base":
        return "the base model"
    if not isinstance(trained, dict):
        return repr(trained)
    arm = trained.get("mode", "?") + (f"@{trained['variant']}" if trained.get("variant") else "")
    return f"run {trained.get('model')}/{trained.get('dataset')}/{arm}/seed{trained.get('seed')}"


def identity_problems(path: str | Path, doc: dict) -> list[str]:
    """Where an evaluation document is not the file its path names (empty: it is). A document outside the results
    layout is held to nothing but its own consistency."""
    path = Path(path)
    ident = doc.get(IDENTITY)
    if not isinstance(ident, dict):
        return [f"NO IDENTITY {path}: the document does not say what it evaluates (model, run, benchmark, setting): "
                f"written before evaluation files carried it, or edited; remake it (snakemake -f {path})"]
    out = []
    try:
        want = expected_identity(path)
    except (ValueError, IndexError):
        want = None
    if want is not None:
        for key, what in (("model", "model"), ("benchmark", "benchmark"), ("setting", "setting")):
            if ident.get(key) != want[key]:
                out.append(f"NOT THIS FILE {path}: its content is {what} {ident.get(key)!r}, its path names "
                           f"{want[key]!r} (another file's result copied or moved here)")
        if ident.get("trained") != want["trained"]:
            out.append(f"NOT THIS FILE {path}: its content evaluates {_said(ident.get('trained'))}, its path names "
                       f"{_said(want['trained'])} (another run's result copied or moved here)")
    out += _consistency_problems(path, doc, ident)
    return out


def _consistency_problems(path: Path, doc: dict, ident: dict) -> list[str]:
    """The identity against the rest of the document: its setting and parameters as the evaluation recorded them,
    one sample per question for a greedy setting, the test set its record read."""
    out = []
    setting, params = ident.get("setting"), ident.get("setting_params") or {}
    if setting == LOGLIK:
        if params.get("protocol") != doc.get("protocol"):
            out.append(f"EDITED {path}: its identity says protocol {params.get('protocol')!r}, the document "
                       f"{doc.get('protocol')!r}")
    else:
        if doc.get("setting") != setting:
            out.append(f"EDITED {path}: its identity says setting {setting!r}, the document {doc.get('setting')!r}")
        for key in SETTING_FIELDS:
            if key in doc and params.get(key) != doc.get(key):
                out.append(f"EDITED {path}: its identity says {key} {params.get(key)!r}, the document "
                           f"{doc.get(key)!r}")
        if setting in SETTING_NAMES:   # the setting's name fixes its mode and whether it samples
            if params.get("mode") not in (None, setting_mode(setting)):
                out.append(f"EDITED {path}: a {setting} file's CoT is {setting_mode(setting)}, its identity says "
                           f"{params.get('mode')}")
            if not is_sampled(setting) and doc.get("n_samples") != 1:
                out.append(f"EDITED {path}: a greedy setting ({setting}) draws one CoT per question, the document "
                           f"holds {doc.get('n_samples')} (a sampled setting's result?)")
    rec = doc.get("provenance") or {}
    made_with = (rec.get("config") or {}).get("setting")
    if setting != LOGLIK and made_with is not None and made_with != setting:
        out.append(f"EDITED {path}: its identity says setting {setting!r}, its record's job ran {made_with!r}")
    data = ((rec.get("inputs") or {}).get("data") or {}).get("sha256")
    test_set = ident.get("test_set") or {}
    if data and test_set.get("sha256") != data:
        out.append(f"EDITED {path}: its identity's test set hashes to {str(test_set.get('sha256'))[:12]}, its record "
                   f"read {data[:12]}")
    ids = [r.get("id") for r in doc.get("problems") or []]
    if ids and test_set.get("ids_sha256") not in (None, ids_sha256(ids)):
        out.append(f"EDITED {path}: its rows' question ids are not those of the test set its identity names")
    return out
