"""Datasets as JSONL rows ``{"id", "question", "answer"}`` and the paper's prompt.

The toy generator makes short addition word problems whose reference chain of thought adds
column by column: a tiny model learns it in minutes but its greedy decode is often wrong,
which is what RL needs to have something to improve."""

from __future__ import annotations

import json
from pathlib import Path

SPLITS = ("train", "validation", "test")


class DataFormatError(ValueError):
    """A data file that cannot be read; the message names file and line."""


def jsonl_objects(path: str | Path):
    """(where, object) for each non-blank line of a JSONL file; 'where' is 'file:line'."""
    path = Path(path)
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DataFormatError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield f"{path}:{lineno}", row


def read_jsonl(path: str | Path, required: tuple[str, ...] = ("id", "question", "answer")) -> list[dict]:
    rows = []
    for where, row in jsonl_objects(path):
        missing = [k for k in required if k not in row]
        if missing:
            raise DataFormatError(f"{where}: missing field(s) {', '.join(missing)}")
        rows.append(row)
    return rows
