"""crate (a result and everything it rests on as a Provenance Run RO-Crate: crate.build)."""

from __future__ import annotations

from pathlib import Path


def default_out(target: Path) -> Path:
    """{results}/crate for a grid's results directory, or for a file under one."""
    target = Path(target)
    results = target if (target / "tables").is_dir() else next(
        (p for p in target.parents if (p / "tables").is_dir()), target.parent)
    return results / "crate"


def cmd_crate(a) -> None:
    import time

    from softtokens.crate.build import write_crate

    start = time.time()
    target = Path(a.target)
    out = Path(a.out) if a.out else default_out(target)
    try:
        where = write_crate(target, out, a.with_checkpoints, a.zip)
    except ValueError as err:
        raise SystemExit(f"crate: {err}") from None
    print(f"{where}: a Provenance Run Crate of {a.target} ({time.time() - start:.1f} s). Check it anywhere: "
          f"softtokens audit {where}; validate it: softtokens crate ... --validate, or rocrate-validator validate -p "
          f"provenance-run-crate-0.5 {where}")
    if a.validate:
        import tempfile

        from softtokens.crate.validate import PROFILE, validate

        with tempfile.TemporaryDirectory(prefix="softtokens-validator-") as cache:
            verdict = validate(where, Path(cache))
        required = [i for i in verdict["issues"] if i[0] == "REQUIRED"]
        print(f"rocrate-validator, {PROFILE}, offline: " + ("passed" if verdict["passed"] else "FAILED")
              + f" ({len(required)} REQUIRED issue(s))")
        for severity, message, entity in verdict["issues"][:20]:
            print(f"  {severity}: {message} ({entity})")
        if not verdict["passed"]:
            raise SystemExit(1)


def register(sub) -> None:
    c = sub.add_parser("crate", help="a table, figure, the report or a grid's results with everything they rest on, as "
                                     "a Workflow Run RO-Crate (Provenance Run Crate 0.5) that `softtokens audit` and "
                                     "rocrate-validator check anywhere")
    c.add_argument("target", help="a table or figure file, the report, or a grid's results directory (results/toy)")
    c.add_argument("--out", default=None, help="the crate's directory (default: the target's results directory's "
                                               "crate/)")
    c.add_argument("--with-checkpoints", action="store_true",
                   help="pack the models' weights too (else each is named by its sha256): what `softtokens audit "
                        "--rerun-sample N CRATE` needs to make evaluation files again from the crate alone")
    c.add_argument("--zip", action="store_true", help="write OUT.zip instead of a directory")
    c.add_argument("--validate", action="store_true", help="then hold it to the profile with rocrate-validator, "
                                                         "offline (the roc-validator package: make test installs it)")
    c.set_defaults(func=cmd_crate)
