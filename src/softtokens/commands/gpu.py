"""gpu-check: the paper's GPU path in one command (docs/gpu.md)."""

from __future__ import annotations

import json
from pathlib import Path

NO_GPU = ("gpu-check: no CUDA device here ({why}). The paper's sizes (Llama-3.2-3B, 64 rollouts of 512-step CoTs, "
          "an evaluation batch of 192) would run for hours on a CPU and measure nothing a GPU run needs. Run it on "
          "a GPU node (docs/gpu.md), or `softtokens gpu-check --smoke --out DIR` for the same code at tiny sizes on "
          "this machine.")


def cmd_gpu_check(a) -> int:
    import signal

    import torch

    from softtokens.data.sources import loader_kind
    from softtokens.gpucheck.run import DEFAULT_SECTIONS, run_gpu_check, stop_on_signals
    from softtokens.rates.throughput import missing_parts
    from softtokens.config.grids import load_config

    if not a.smoke:
        if a.device and not a.device.startswith("cuda"):
            raise SystemExit(NO_GPU.format(why=f"--device {a.device}"))
        if not torch.cuda.is_available():
            raise SystemExit(NO_GPU.format(why="torch.cuda.is_available() is False"))

    sections = tuple(a.sections.split(",")) if a.sections else DEFAULT_SECTIONS
    modes = tuple(a.modes.split(","))
    previous = stop_on_signals()   # SIGTERM / SIGINT end the run through its clean-up, the report written
    try:
        report = run_gpu_check(Path(a.out), load_config(a.config, loader_kind), smoke=a.smoke, sections=sections,
                               modes=modes, steps=a.steps, repeats=a.repeats, work_dir=a.work_dir,
                               eval_cot=a.eval_cot, device=a.device, speed=a.speed)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(report.summary())
    print(f"wrote {Path(a.out) / 'gpu_check.json'} and gpu_check.md")
    lacking = missing_parts(json.loads((Path(a.out) / "gpu_check.json").read_text()))
    if lacking:   # what the forecast's refit (rates.throughput) will take from elsewhere, said where it is made
        print(f"the forecast's refit from this file lacks: {'; '.join(lacking)} (taken from an earlier gpu-check "
              "or the default rates, and named in plan's rates line)")
    if report.meta.get("interrupted"):
        return 130
    return 0 if report.passed else 1


def register(sub) -> None:
    c = sub.add_parser("gpu-check", help="the paper's GPU path in one command (engine, evaluation, training): "
                                         "DIR/gpu_check.json and .md (docs/gpu.md)")
    c.add_argument("--out", required=True, help="directory for gpu_check.json and gpu_check.md")
    c.add_argument("--smoke", action="store_true", help="a tiny model at cut sizes: the same code in seconds (CI)")
    c.add_argument("--config", default="config.yaml", help="the paper grid's settings are read from here")
    c.add_argument("--sections", default=None, help="comma-separated subset of engine,evaluation,training,head_loss "
                                                     "(default: the first three)")
    c.add_argument("--speed", action="store_true",
                   help="the speed profile: decode (SDPA and flex), one soft and one hard RL step with the update "
                        "profiled, the head-loss A/B; no correctness round trips; a time plan and a deadline per "
                        "section (~6 min on an H100)")
    c.add_argument("--modes", default="soft", help="training modes to step, comma-separated (hard,soft,fuzzy)")
    c.add_argument("--steps", type=int, default=None, help="RLOO steps per mode (default 2)")
    c.add_argument("--repeats", type=int, default=None, help="timed rollouts per setting (median; default 2)")
    c.add_argument("--eval-cot", type=int, default=None, help="evaluation CoT budget (default: the paper grid's)")
    c.add_argument("--work-dir", type=Path, default=None,
                   help="where the random base and checkpoints go (emptied at the start; removed at the end, on "
                        "SIGTERM and SIGINT too); default: a temporary directory")
    c.add_argument("--device", default=None, help="default: cuda (the paper's sizes refuse to run without one); "
                                                  "--smoke runs where it is, a CPU too")
    c.set_defaults(func=cmd_gpu_check)
