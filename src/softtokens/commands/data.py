"""prepare-data (a dataset's splits as JSONL), build-toy-base (the toy's base model) and build-packaged-base (a
real pretrained model a pip package ships)."""

from __future__ import annotations

import json
from pathlib import Path

from softtokens.commands.common import add_expect, check_expected, parse_settings

TOY_BASE_KEYS = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size", "sft_steps",
                 "sft_batch_size", "sft_lr", "seed", "forget_carry_rate")


def cmd_prepare_data(a) -> None:
    from softtokens.data.splits import prepare
    from softtokens.store.files import write_jsonl
    from softtokens.store.provenance import Provenance

    s = parse_settings(a.settings)
    splits = tuple(a.splits.split(","))
    prov = Provenance("prepare_data", {**s, "splits": list(splits)}, seeds={"seed": s.get("seed")}, params=s)
    prepared, reports = prepare(a.dataset, s, splits)
    for split, report in reports.items():
        if report["local_path"]:  # a local copy: a leaf by its content (a file, or every file of a directory)
            prov.add_local_leaf(f"source_{split}", report["local_path"])
        else:
            prov.add_external(f"source_{split}", report["reference"])
    out = Path(a.out_dir)
    for split, rows in prepared.items():
        path = out / f"{split}.jsonl"
        write_jsonl(path, rows)
        prov.write_sidecar(path, extra={"rows": len(rows), "split": split, "source_reports": reports})
    for split, report in reports.items():
        dropped = ", ".join(f"{n} {why}" for why, n in report["dropped"].items()) or "none"
        print(f"{a.dataset} {split}: read {report['read']} rows from {report['reference']}, kept {report['kept']}, "
              f"dropped {sum(report['dropped'].values())} ({dropped})")
    print(json.dumps({k: len(v) for k, v in prepared.items()}))


def cmd_build_toy_base(a) -> None:
    import os
    import socket
    import sys
    import time

    from softtokens.data.rows import read_jsonl
    from softtokens.engine.cot import CotEngine
    from softtokens.engine.settings import INFERENCE_SETTINGS
    from softtokens.model.toy import build_toy_base
    from softtokens.store import paths
    from softtokens.store.files import atomic_dir, write_json
    from softtokens.store.provenance import Provenance
    from softtokens.train.validation import greedy_accuracy

    s = parse_settings(a.settings)
    expected = check_expected(a.expect)
    prov = Provenance("build_toy_base", s, inputs={"train": a.train, "validation": a.validation},
                      seeds={"seed": s["seed"]}, params=s)
    prov.expected = expected
    train, val = read_jsonl(a.train), read_jsonl(a.validation)
    progress = Path(paths.model_progress(str(a.out)))
    printed = [-1]   # the last tenth of the steps said on the console

    def report(row: dict) -> None:   # `softtokens status` and the console see how far the SFT is
        write_json(progress, {**row, "updated": time.time(), "pid": os.getpid(), "host": socket.gethostname()})
        done = row["step"] + 1
        tenth = 10 * done // row["steps"]
        if tenth > printed[0]:
            printed[0] = tenth
            print(f"toy base SFT: step {done}/{row['steps']}, loss {row['loss']:.3f}, {row['seconds']:.0f} s",
                  file=sys.stderr, flush=True)

    model, tok, log = build_toy_base(train, **{k: s[k] for k in TOY_BASE_KEYS if k in s}, threads=a.threads,
                                     progress=report)
    acc = greedy_accuracy(CotEngine(model, tok), val, INFERENCE_SETTINGS["hard_greedy"], s["cot_max_tokens"],
                          s["answer_max_tokens"])
    with atomic_dir(a.out) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_json(tmp / "sft_log.json", {"log": log, "val_greedy_accuracy": acc,
                                          "parameters": sum(p.numel() for p in model.parameters())})
    prov.write_sidecar(a.out, extra={"val_greedy_accuracy": acc})
    progress.unlink(missing_ok=True)
    print(f"toy base: {sum(p.numel() for p in model.parameters())} parameters, validation greedy accuracy {acc:.3f}")


def cmd_build_packaged_base(a) -> None:
    import time

    import torch

    from softtokens.model.packaged import PackageMissing, build_packaged_model, package_leaf
    from softtokens.store.files import atomic_dir
    from softtokens.config.names import packaged_name
    from softtokens.store.provenance import Provenance

    torch.set_num_threads(a.threads)
    s = parse_settings(a.settings)
    name = packaged_name(s["source"])
    prov = Provenance("build_packaged_base", s, params=s)
    started = time.time()
    try:
        prov.add_leaf("package", package_leaf(name))   # the GGUF's sha256 against the pin, before any build
        with atomic_dir(a.out) as tmp:
            conversion = build_packaged_model(name, tmp)
    except PackageMissing as err:
        raise SystemExit(f"error: {err}") from None
    prov.write_sidecar(a.out, extra={"conversion": conversion})
    print(f"{s['source']}: {conversion['parameters']:,} parameters in {a.out} ({time.time() - started:.0f} s); "
          f"{conversion['method']}")


def register(sub) -> None:
    c = sub.add_parser("prepare-data", help="write train/validation/test JSONL for one dataset")
    c.add_argument("--dataset", required=True)
    c.add_argument("--settings", required=True)
    c.add_argument("--out-dir", required=True)
    c.add_argument("--splits", required=True,
                   help="comma-separated: train,validation (a training set) and/or test (a benchmark)")
    c.set_defaults(func=cmd_prepare_data)

    c = sub.add_parser("build-toy-base", help="tokenizer + tiny Llama + supervised CoTs")
    add_expect(c)
    for arg in ("--settings", "--train", "--validation", "--out"):
        c.add_argument(arg, required=True)
    c.add_argument("--threads", type=int, default=1)
    c.set_defaults(func=cmd_build_toy_base)

    c = sub.add_parser("build-packaged-base", help="a real pretrained model a pip package ships, as a model directory")
    c.add_argument("--settings", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--threads", type=int, default=1)
    c.set_defaults(func=cmd_build_packaged_base)
