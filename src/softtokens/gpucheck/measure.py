"""Timing, bandwidth and peak memory on the device under check (CUDA events where there is a GPU)."""

from __future__ import annotations

import gc
import json
import statistics
import time

import torch

from softtokens.gpucheck.shape import PLAN_TOLERANCE, Report


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev: torch.device) -> float:
    sync(dev)
    t = time.perf_counter()
    fn()
    sync(dev)
    return time.perf_counter() - t


def copy_bandwidth(dev: torch.device) -> float:
    """Bytes per second of a device-to-device copy, reads and writes counted."""
    n = 2 ** 30 if dev.type == "cuda" else 2 ** 26
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = statistics.median(timed(lambda: dst.copy_(src), dev) for _ in range(5))
    src = dst = None  # freed before the next section measures memory
    return 2 * n / seconds


def reset_peak(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)


def peak_bytes(dev: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None


def allocated_bytes(dev: torch.device) -> float | None:
    return torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None


def gb(x: float | None) -> float | None:
    return None if x is None else round(x / 1e9, 2)


def release(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def memory_check(report: Report, sec: str, name: str, measured: float | None, planned: float, terms: dict) -> None:
    if measured is None:
        report.check(sec, f"{name} vs plan", None, "no CUDA device", f"within {PLAN_TOLERANCE:.0%}")
        return
    ratio = measured / planned
    report.check(sec, f"{name} vs plan", abs(ratio - 1) <= PLAN_TOLERANCE,
                 f"{measured / 1e9:.2f} GB measured, {planned / 1e9:.2f} GB planned ({ratio:.2f}x)",
                 f"within {PLAN_TOLERANCE:.0%}", detail=json.dumps(terms))
