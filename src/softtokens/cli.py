"""`python -m softtokens <command>`: the one entry point every Snakemake rule calls. It parses
the command line and calls the command (softtokens.commands); it holds no setting of its own."""

from __future__ import annotations

import argparse
import os
import sys

from softtokens.commands import crate, data, evaluate, exits, gpu, report, train

COMMAND_MODULES = (data, train, evaluate, report, crate, gpu, exits)
DESCRIPTION = ("softtokens: a reproduction of 'Soft Tokens, Hard Truths' (Butt et al., 2025). Each workflow stage is "
               "a command here (the Snakemake rules call them), beside the tools a user runs: plan (memory and cost "
               "before a grid), status (a grid while it runs), audit (where a result came from), docs and gpu-check.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="softtokens", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    # CUDA's caching allocator grows in expandable segments instead of fixed blocks: on an H100 the
    # update pass of llama-3b on one GPU held 72.2 GB but reserved 81.6 GB, the whole card, in blocks
    # it could not reuse (docs/gpu.md). Read at the first CUDA allocation; a user's setting wins.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # a command that starts itself again (train under accelerate) passes them on
    from softtokens.store.files import JsonlError, MalformedFile

    try:
        return int(args.func(args) or 0)
    except (MalformedFile, JsonlError) as err:   # a file that is not what it should be: named in one line, no traceback
        print(f"softtokens {args.command}: stopped: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
