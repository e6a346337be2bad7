"""The config as YAML text: its syntax checked before anything reads it, where each key is written (file:line),
and the error that names a key and the closest valid name. Below config.grids, which checks what the text means."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Iterable

import yaml


class ConfigError(ValueError):
    """config.yaml is malformed; the message names the key."""


def unknown_name(what: str, name: str, known: Iterable[str], key: str, lines: dict | None = None,
                 elsewhere: str = "") -> ConfigError:
    """'FILE:LINE: 'KEY': unknown WHAT 'NAME' (did you mean 'X'? WHATs: A, B)': one message for every
    name a grid or a target gets wrong (models, datasets, benchmarks, modes, settings, seeds)."""
    known = [str(k) for k in known]
    close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
    where = (lines or {}).get(tuple(int(p) if p.isdigit() else p for p in key.split("."))) if lines else None
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(f"{where + ': ' if where else ''}'{key}': unknown {what} {name!r} ({hint}{what}s: "
                       f"{', '.join(known) or 'none'}){elsewhere}")


def check_yaml_syntax(path: str | Path) -> None:
    """Stop with file:line and YAML's own words where ``path`` does not parse (Snakemake's loader says
    only 'not valid JSON or YAML'); a file that parses passes silently."""
    path = Path(path)
    if not path.is_file():
        return
    try:
        yaml.safe_load(path.read_text())
    except yaml.MarkedYAMLError as err:
        # an unclosed bracket or quote is noticed far below where it opens, and the parser's context may be the
        # mapping that holds it: name the opening first
        opened, noticed = err.context_mark, err.problem_mark
        found = opening(path.read_text().splitlines(), opened.line if opened else 0, noticed.line) if noticed else None
        mark = opened or noticed
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        if found is not None and (mark is None or found != (mark.line, mark.column)):
            opened, where = mark or noticed, f"{path}:{found[0] + 1}:{found[1] + 1}"
        words = "; ".join(w for w in (err.context, err.problem) if w)
        also = (f" (noticed at line {noticed.line + 1}, column {noticed.column + 1})"
                if opened and noticed and (opened.line, opened.column) != (noticed.line, noticed.column) else "")
        raise ConfigError(f"{where}: not valid YAML: {words}{also}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None


QUOTES, OPENERS, CLOSERS = "\"'", "[{", "]}"


def opening(lines: list[str], first: int, last: int) -> tuple[int, int] | None:
    """(line, column), 0-based, of the quote, bracket or brace that opens between lines ``first`` and ``last`` and
    is still open at ``last``: a quote not closed on its own line (config files do not fold quoted scalars), else
    the outermost bracket left open. A quote opens a scalar only where a value starts (after a blank, ':', '-',
    ',', '[' or '{'), so an apostrophe inside a word is not one; comments are skipped."""
    stack: list[tuple[int, int]] = []
    for i in range(first, min(last, len(lines) - 1) + 1):
        line, j, quote = lines[i], 0, None
        while j < len(line):
            c = line[j]
            if quote is not None:
                if c == "\\" and line[quote[2]] == '"':
                    j += 1
                elif c == line[quote[2]]:
                    if c == "'" and line[j + 1:j + 2] == "'":
                        j += 1
                    else:
                        quote = None
            elif c == "#" and (j == 0 or line[j - 1] in " \t"):
                break
            elif c in QUOTES and (j == 0 or line[j - 1] in " \t:-,[{"):
                quote = (i, j, j)
            elif c in OPENERS:
                stack.append((i, j))
            elif c in CLOSERS and stack:
                stack.pop()
            j += 1
        if quote is not None:
            return quote[0], quote[1]
    return stack[0] if stack else None


def key_path(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def key_lines(config_files: Iterable[str | Path]) -> dict[tuple, str]:
    """Where each key of the config files is written: key path -> 'file:line' (a later file, which
    overrides an earlier one, wins). Read from YAML's own nodes, so a message can point at the line."""
    out: dict[tuple, str] = {}

    def walk(node, path: tuple, name: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                k = path + (key.value,)
                out[k] = f"{name}:{key.start_mark.line + 1}"
                walk(value, k, name)
        elif isinstance(node, yaml.SequenceNode):
            for i, value in enumerate(node.value):
                out[path + (i,)] = f"{name}:{value.start_mark.line + 1}"
                walk(value, path + (i,), name)

    for f in config_files or ():
        f = Path(f)
        if f.is_file():
            walk(yaml.compose(f.read_text()), (), str(f))
    return out
