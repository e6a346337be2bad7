"""The outputs a job cut off with Snakemake left incomplete, read from Snakemake's own markers, so
that the next run can say in words why it reruns them (with `rerun-incomplete`, the workflow
profile's setting, Snakemake's dry run gives the reason only as 'Forced execution')."""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

MARKERS = Path(".snakemake/incomplete")


def incomplete_outputs(workdir: str | Path = ".") -> list[str]:
    """The output paths Snakemake has marked incomplete in ``workdir`` (each marker's path is the
    output's urlsafe base64, cut into segments every one of which but the last starts with '@')."""
    root = Path(workdir) / MARKERS
    if not root.is_dir():
        return []
    out = []
    for marker in root.rglob("*"):
        if not marker.is_file():
            continue
        parts = marker.relative_to(root).parts
        try:
            out.append(base64.urlsafe_b64decode("".join(p.removeprefix("@") for p in parts)).decode())
        except (binascii.Error, UnicodeDecodeError, ValueError):
            continue
    return sorted(out)


def interrupted_note(workdir: str | Path = ".") -> str | None:
    """One line for the console where outputs are incomplete, else None."""
    paths = incomplete_outputs(workdir)
    if not paths:
        return None
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    return (f"softtokens: {len(paths)} output(s) were left incomplete by an interrupted job ({shown}): this run "
            "redoes their jobs (rerun-incomplete, profiles/default; Snakemake calls the reason 'Forced execution'; "
            "a training job resumes from its saved state)")
