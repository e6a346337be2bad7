"""The checks a table, figure or report job runs on its inputs before it reads them, so that a
rebuild cannot launder an edited or damaged file into a new record: an input whose record is
missing or no longer true of it (audit.chain's node checks: its own hash, its config's hash, its
numbers against its rows, its checkpoint against its run's selection) stops the job, naming each
file and what to do. The checkpoints behind the inputs are not hashed again here (gigabytes per
run): their bytes are checked where they are loaded, and by `softtokens audit`."""

from __future__ import annotations

from pathlib import Path

from softtokens.audit.chain import malformed, node_problems, shipped
from softtokens.audit.rows import identical_seed_problems
from softtokens.store.provenance import read_record


class InputRefused(SystemExit):
    """An input of a summary job that does not hold what its record says; the message names it."""


def input_problems(inputs: list[Path]) -> list[str]:
    out = []
    for p in map(Path, inputs):
        if not p.exists():
            out.append(f"MISSING {p}")
            continue
        if shipped(p):
            continue
        rec = read_record(p)
        if rec is None:
            out.append(malformed(p) or f"NO PROVENANCE RECORD {p}: no job of this workflow made it as it is")
            continue
        out += node_problems(p, rec, deep=False)
    return out + identical_seed_problems([p for p in map(Path, inputs) if p.exists()])


def refuse_bad_inputs(inputs: list[Path], job: str) -> None:
    """Stop ``job`` before it reads anything when an input fails its checks (input_problems)."""
    problems = input_problems(inputs)
    if problems:
        shown = "\n  ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        raise InputRefused(
            f"{job}: refused to read {len(problems)} input problem(s); no output was written:\n  {shown}\n"
            "An edited number or record is not rebuilt into a new table: restore the file, or remake it with "
            "`snakemake -f FILE` (its job writes it and its record again); `softtokens audit FILE` shows its chain.")
