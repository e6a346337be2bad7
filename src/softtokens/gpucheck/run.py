"""``run_gpu_check``: the sections in order, the JSON rewritten after each (a run stopped by a time
limit keeps what it measured)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

from softtokens.gpucheck.engine_check import check_engine
from softtokens.gpucheck.eval_check import check_evaluation
from softtokens.gpucheck.measure import gb, release
from softtokens.gpucheck.models import (
    architecture_config,
    check_tokenizer,
    peak_logits,
    random_model,
    save_base,
)
from softtokens.gpucheck.shape import Report, check_shape
from softtokens.gpucheck.train_check import check_training
from softtokens.model.loading import DTYPES
from softtokens.model.scale import embedding_scale

SECTIONS = ("engine", "evaluation", "training")


# ---------------------------------------------------------------- the command
def run_gpu_check(out: Path, config: dict, smoke: bool = False, sections: tuple[str, ...] = SECTIONS,
                  modes: tuple[str, ...] = ("soft",), steps: int | None = None, repeats: int | None = None,
                  work_dir: Path | None = None, eval_cot: int | None = None, device: str | None = None) -> Report:
    import transformers

    from softtokens.train.plan import _from_config_json

    shape = check_shape(config, smoke, modes, steps, repeats, eval_cot)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        dev = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
        torch.cuda.set_device(dev)
    dtype = DTYPES[shape.rl["compute_dtype"]]
    fields = architecture_config(shape.source)
    tok = check_tokenizer(fields.get("vocab_size"))
    model = random_model(fields, tok, dtype, dev)
    peaked = peak_logits(model, tok)
    arch = _from_config_json(json.dumps({**fields, "vocab_size": model.config.vocab_size}), shape.source)
    sigma = embedding_scale(model, len(tok)).sigma(shape.rl["noise_factor"])
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "smoke": smoke,
            "device": {"type": dev.type, "name": torch.cuda.get_device_name(dev) if dev.type == "cuda"
                       else platform.processor() or platform.machine(),
                       "count": torch.cuda.device_count() if dev.type == "cuda" else 0,
                       "memory_GB": gb(torch.cuda.get_device_properties(dev).total_memory) if dev.type == "cuda"
                       else None},
            "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "model": shape.source, "parameters": sum(p.numel() for p in model.parameters()),
            "compute_dtype": shape.rl["compute_dtype"], "sigma": sigma, "random_model": peaked,
            "shape": {k: v for k, v in asdict(shape).items() if k != "rl"} | {
                k: shape.rl[k] for k in ("prompts_per_step", "samples_per_prompt", "cot_max_tokens",
                                         "answer_max_tokens", "micro_batch_size", "activation_checkpointing",
                                         "param_dtype", "compute_dtype")},
            "env": {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES")}}
    report = Report(Path(out), meta)
    report.write()
    started = time.perf_counter()
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(sorted(unknown))} (known: {', '.join(SECTIONS)})")
    work = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=work_dir))
    try:
        todo = [s for s in SECTIONS if s in sections]   # training last: it releases the model
        for i, name in enumerate(todo, 1):
            t0 = time.perf_counter()
            before = len(report.checks)
            print(f"[gpu-check] section {i} of {len(todo)}: {name} ...", flush=True)
            try:
                if name == "engine":
                    check_engine(report, model, tok, shape, sigma, dev)
                elif name == "evaluation":
                    check_evaluation(report, model, tok, shape, arch, sigma, dev)
                else:
                    base = save_base(model, tok, work)
                    model = None
                    release(dev)
                    check_training(report, base, shape, arch, dev, work)
            except Exception as err:
                report.check(name, "section ran", False, f"{type(err).__name__}: {err}",
                             detail=traceback.format_exc(limit=12))
            if len(report.checks) == before:   # a section that checked nothing is no evidence of anything
                report.check(name, "section checked something", False, "no check recorded")
            report.sections.setdefault(name, {})["seconds"] = round(time.perf_counter() - t0, 1)
            done = report.checks[before:]
            print(f"[gpu-check] section {i} of {len(todo)}: {name} done in {report.sections[name]['seconds']} s: "
                  f"{sum(c['passed'] is True for c in done)} ok, {sum(c['passed'] is False for c in done)} failed, "
                  f"{sum(c['passed'] is None for c in done)} n/a", flush=True)
            report.write()
            release(dev)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.meta["seconds"] = round(time.perf_counter() - started, 1)
    report.write()
    return report
