"""An evaluation of a trained run held against its run's selection: the selected.json its record
names is its own run's, the checkpoint it names is the one that selection chose, and that checkpoint
is the one its training recorded (by hash), so an evaluation file cannot be passed off as another
run's by editing the paths in its record.

Why from records, not by hashing the checkpoint again: a table job checks every input this way before
it reads them (audit.inputs), and a checkpoint is gigabytes; its bytes are checked where they are read
(model.loading) and by `softtokens audit` (audit.chain)."""

from __future__ import annotations

from pathlib import Path

from softtokens.store.files import MalformedFile, read_json
from softtokens.store.paths import selection_of_eval
from softtokens.store.provenance import at_root, read_record, record_root
from softtokens.train.selection import identity_problem


def _same(a: str | Path, b: str | Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def link_problems(path: Path, rec: dict, doc: dict, root: Path | None = None) -> list[str]:
    """What ties an evaluation file to the wrong run or checkpoint (empty: its links hold). ``root``: what the
    record's paths are relative to (store.provenance.record_root)."""
    try:
        selected = selection_of_eval(path)
    except (ValueError, IndexError):
        return []   # not in the results layout: nothing to tie it to
    inputs = rec.get("inputs") or {}
    if selected is None:
        if "checkpoint" in inputs or "selected" in inputs:
            return [f"EDITED RECORD {path}: it evaluates a base model, but its record names a trained checkpoint "
                    f"({(inputs.get('checkpoint') or inputs.get('selected'))['path']})"]
        return []
    sel, ckpt = inputs.get("selected"), inputs.get("checkpoint")
    if sel is None or ckpt is None:
        return [f"EDITED RECORD {path}: it evaluates the run of {selected}, but its record names no selected "
                "checkpoint"]
    if not _same(at_root(root, sel["path"]), selected):
        return [f"EDITED RECORD {path}: it evaluates the run of {selected}, but its record names another selection "
                f"({sel['path']})"]
    if not selected.is_file():
        return [f"MISSING {selected}: the selection {path} was made from"]
    try:
        chosen = read_json(selected)
    except MalformedFile as err:
        return [f"MALFORMED {err}"]
    chosen_root = record_root(selected, chosen.get("provenance") or {})
    checkpoint = at_root(root, ckpt["path"])
    out = []
    if not _same(checkpoint, at_root(chosen_root, chosen.get("checkpoint", ""))):
        out.append(f"EDITED RECORD {path}: it was made from checkpoint {ckpt['path']}, but its run selected "
                   f"{chosen.get('checkpoint')} ({selected})")
    made = ((read_record(checkpoint) or {}).get("output") or {}).get("sha256") if checkpoint.exists() else None
    if made and made != ckpt["sha256"]:
        out.append(f"CHANGED {ckpt['path']}: {path} was made from a checkpoint with sha256 {ckpt['sha256'][:12]}, the "
                   f"checkpoint there now is {made[:12]} by its training's record")
    step = (doc.get("selection") or {}).get("step")
    if step is not None and step != chosen.get("step"):
        out.append(f"EDITED {path}: it says step {step} was selected, {selected} says step {chosen.get('step')}")
    if checkpoint.is_dir():   # the checkpoint is its run's own (not another run's swapped in)
        problem = identity_problem(checkpoint, selected.parent, chosen.get("step"))
        if problem:
            out.append(f"NOT ITS RUN'S: {path} rests on {problem.split('. Nothing')[0]}")
    return out
