"""``run_gpu_check``: the sections in order, the JSON rewritten after every measured step and section
(``complete`` false until the end: a run stopped at any second keeps what it measured), the work
directory emptied at the start and removed at the end however the run ends (SIGTERM and SIGINT are an
exception here, so the clean-up runs). ``speed``: the minutes spent on speed only (SPEED_PLAN)."""

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
from softtokens.gpucheck.head_check import check_head
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

SECTIONS = ("engine", "evaluation", "training", "head_loss")
DEFAULT_SECTIONS = ("engine", "evaluation", "training")
# the speed profile: decode (SDPA and flex), one soft and one hard RL step with the update profiled, the
# head-loss A/B; no correctness round trips; each section's share of ~6 minutes on an H100 from a cold
# start of the process (model build ~40 s), past which it measures nothing new
SPEED_PLAN = {"engine": 90.0, "training": 150.0, "head_loss": 60.0}


class Stopped(BaseException):
    """SIGTERM or SIGINT reached gpu-check: raised where the run is, so its clean-up runs and the report
    says where it stopped (BaseException: no section's `except Exception` swallows it)."""


def stop_on_signals():
    """SIGTERM and SIGINT raise Stopped (a `timeout -s INT`, a scancel, Ctrl-C): restored by the caller."""
    import signal

    def raise_stopped(signum, frame):
        raise Stopped(signal.Signals(signum).name)
    return {s: signal.signal(s, raise_stopped) for s in (signal.SIGTERM, signal.SIGINT)}


def versions() -> dict:
    """The device's torch, CUDA, transformers and driver versions, beside the grid's pins (warned when
    they differ: the numbers are the device's, not the pinned stack's)."""
    import subprocess

    import transformers

    driver = None
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "driver": driver, "pinned": PINNED}


# what envs/softtokens-gpu.yaml (and the CPU set-up) install: a device with other versions is reported as such
PINNED = {"torch": "2.13", "transformers": "5."}


def version_warnings(v: dict) -> list[str]:
    return [f"the device's {k} {v[k]} is not the grid's pinned {want}* (numbers measured with the device's)"
            for k, want in PINNED.items() if not str(v.get(k) or "").startswith(want)]


def empty_work_dir(work_dir: Path | None) -> Path:
    """A fresh temporary directory for the random base and checkpoints; ``work_dir``, when given, emptied first
    (a run killed before its clean-up left ~45 GB there once, and the next filled the disk)."""
    if work_dir is not None:
        work_dir = Path(work_dir)
        if work_dir.exists():
            for entry in work_dir.iterdir():
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
        work_dir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="gpu-check-", dir=work_dir))


# ---------------------------------------------------------------- the command
def run_gpu_check(out: Path, config: dict, smoke: bool = False, sections: tuple[str, ...] = DEFAULT_SECTIONS,
                  modes: tuple[str, ...] = ("soft",), steps: int | None = None, repeats: int | None = None,
                  work_dir: Path | None = None, eval_cot: int | None = None, device: str | None = None,
                  speed: bool = False) -> Report:
    from softtokens.sizing.plan import _from_config_json

    if speed:   # the speed profile: its sections, soft and hard, one step each, deadlines (SPEED_PLAN)
        sections, modes, steps = tuple(SPEED_PLAN), ("soft", "hard"), steps or 1
        print("[gpu-check] speed profile, time plan: " + ", ".join(f"{k} {v:.0f} s" for k, v in SPEED_PLAN.items())
              + f" (~{sum(SPEED_PLAN.values()) / 60 + 0.7:.1f} min with the model's build)", flush=True)
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(sorted(unknown))} (known: {', '.join(SECTIONS)})")
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
    found = versions()
    for warning in version_warnings(found):
        print(f"[gpu-check] WARNING: {warning}", flush=True)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "smoke": smoke, "speed": speed, "complete": False,
            "versions": found, "version_warnings": version_warnings(found),
            "device": {"type": dev.type, "name": torch.cuda.get_device_name(dev) if dev.type == "cuda"
                       else platform.processor() or platform.machine(),
                       "count": torch.cuda.device_count() if dev.type == "cuda" else 0,
                       "memory_GB": gb(torch.cuda.get_device_properties(dev).total_memory) if dev.type == "cuda"
                       else None},
            "torch": found["torch"], "cuda": found["cuda"], "transformers": found["transformers"],
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
    work = empty_work_dir(work_dir)
    section = None
    try:
        todo = [s for s in SECTIONS if s in sections]   # training after the model's sections: it releases it
        for i, name in enumerate(todo, 1):
            section = name
            t0 = time.perf_counter()
            deadline = time.monotonic() + SPEED_PLAN[name] if speed else None
            before = len(report.checks)
            print(f"[gpu-check] section {i} of {len(todo)}: {name} ...", flush=True)
            try:
                if name == "engine":
                    check_engine(report, model, tok, shape, sigma, dev, speed=speed, deadline=deadline)
                elif name == "evaluation":
                    check_evaluation(report, model, tok, shape, arch, sigma, dev)
                elif name == "training":
                    base = save_base(model, tok, work)
                    model = None
                    release(dev)
                    check_training(report, base, shape, arch, dev, work, speed=speed, deadline=deadline)
                else:
                    model = None
                    release(dev)
                    check_head(report, shape, dev, deadline=deadline)
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
        section = None
    except Stopped as err:   # SIGTERM / SIGINT: the report says where, and the clean-up below runs
        report.meta["interrupted"] = f"{err.args[0]} during {section or 'the start'}"
        print(f"[gpu-check] stopped by {err.args[0]} during {section or 'the start'}; what was measured is written",
              flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        report.meta["seconds"] = round(time.perf_counter() - started, 1)
        report.write()
    if "interrupted" in report.meta:
        return report
    report.meta["complete"] = True
    report.write()
    return report
