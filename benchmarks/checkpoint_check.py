"""What checking a checkpoint's bytes costs: model.loading.load_model (the manifest's sha256 of every file
computed by model.checkpoint.ContentCheck in threads beside the load) against a plain from_pretrained of the
same directory, in the same process, alternating, as ratios; and the hash alone.

    python benchmarks/checkpoint_check.py --out benchmarks/results/checkpoint_check_cpu_DATE.json

A load here is from_pretrained and then every parameter read once (safetensors maps the file: from_pretrained
alone reads nothing, the first use does; an evaluation's copy to the GPU reads every byte). Three ways:
- ``plain``: no check;
- ``checked``: the check before the model is used (load_model's default: training's resume, selection);
- ``deferred``: the check beside an evaluation of --eval-seconds (load_model(defer_check=True), then
  confirm_checkpoint before the result is kept: what the evaluation jobs do); the evaluation is modelled as
  the host waiting for a GPU (sleep), so the ratio is the job's wall clock with the check over without.
The checkpoint is a random Llama written by save_pretrained in float32 (the training checkpoints' dtype) with
the manifest a run writes (model.checkpoint.TrainerState), of --hidden/--layers/--vocab (default ~5 GB, within
this machine's memory; the paper's 3B checkpoint is 12.85 GB: the hash scales with the bytes). Both loads read
from the page cache after the first: the load is at its fastest, where the check is most visible. The JSON is
rewritten after every measurement, so a run cut short keeps what it measured."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch


def write(out: Path | None, report: dict) -> None:
    if out is None:
        return
    from softtokens.store.files import write_json

    write_json(out, report)


def make_checkpoint(d: Path, hidden: int, layers: int, vocab: int) -> int:
    from transformers import LlamaConfig, LlamaForCausalLM

    from softtokens.model.checkpoint import TrainerState

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 128, num_key_value_heads=max(1, hidden // 512),
                      tie_word_embeddings=True)
    with torch.device("meta"):
        shell = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(0)
    weights = {k: torch.randn(v.shape, generator=g) * 0.02 for k, v in shell.state_dict().items()
               if k != "lm_head.weight"}
    shell.save_pretrained(d, state_dict=weights)
    del weights
    TrainerState(step=1, best_val=0.0, base_val=0.0, embedding_scale={}, sigma=0.0, noise={}, config={},
                 base_model="random", base_revision=None, processes=1).write(d)
    return sum(f.stat().st_size for f in d.glob("*.safetensors"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eval-seconds", type=float, default=20.0,
                    help="the evaluation the deferred check runs beside (a short paper evaluation job's compute)")
    ap.add_argument("--work-dir", default=None, help="where the checkpoint is written (default: a temporary dir)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from softtokens.model.loading import confirm_checkpoint, load_model
    from softtokens.store.files import sha256_file

    out = Path(a.out) if a.out else None
    work = Path(a.work_dir or tempfile.mkdtemp(prefix="ckpt-check-"))
    d = work / "checkpoint"
    shutil.rmtree(d, ignore_errors=True)
    report = {"benchmark": "checkpoint_check", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "machine": f"{os.cpu_count()} CPUs, {torch.__version__}", "complete": False,
              "shape": {"hidden": a.hidden, "layers": a.layers, "vocab": a.vocab}}
    t0 = time.perf_counter()
    report["bytes"] = make_checkpoint(d, a.hidden, a.layers, a.vocab)
    report["write_s"] = round(time.perf_counter() - t0, 2)
    write(out, report)
    weights = next(d.glob("*.safetensors"))
    t0 = time.perf_counter()
    sha256_file(weights)
    report["hash_only_s"] = round(time.perf_counter() - t0, 2)
    report["hash_GBps"] = round(report["bytes"] / 1e9 / report["hash_only_s"], 3)
    write(out, report)
    def touched(model) -> None:   # every parameter read once, as a copy to a GPU would
        with torch.no_grad():
            for p in model.parameters():
                p.sum()

    def run(kind: str) -> float:
        t0 = time.perf_counter()
        if kind == "plain":
            touched(AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32))
        elif kind == "checked":
            touched(load_model(d, "float32"))
        elif kind == "plain_job":
            touched(AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32))
            time.sleep(a.eval_seconds)
        else:   # deferred_job
            model = load_model(d, "float32", defer_check=True)
            touched(model)
            time.sleep(a.eval_seconds)
            confirm_checkpoint(model)
        return round(time.perf_counter() - t0, 3)

    kinds = ("plain", "checked", "plain_job", "deferred_job")
    report.update({f"{k}_s": [] for k in kinds}, eval_seconds=a.eval_seconds)
    for i in range(a.repeats):   # alternating, each order in turn, so neither always reads a warmer cache
        for kind in (kinds if i % 2 == 0 else kinds[::-1]):
            report[f"{kind}_s"].append(run(kind))
            write(out, report)
            print(f"{kind}: {report[f'{kind}_s'][-1]:.2f} s", flush=True)
    med = {k: statistics.median(report[f"{k}_s"]) for k in kinds}
    report.update({f"{k}_median_s": v for k, v in med.items()}, complete=True,
                  checked_over_plain=round(med["checked"] / med["plain"], 3),
                  deferred_job_over_plain_job=round(med["deferred_job"] / med["plain_job"], 3))
    write(out, report)
    print(json.dumps({k: report[k] for k in ("bytes", "hash_GBps", "plain_median_s", "checked_median_s",
                                             "checked_over_plain", "deferred_job_over_plain_job")}))
    if not a.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
