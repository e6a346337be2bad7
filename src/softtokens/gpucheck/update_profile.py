"""One update of the training section under the profiler: where its time goes (the top kernels),
how often it waits on the host, the FLOP rate it reaches and its share of the card's, and the
forecast of its own shape beside what it took.

Why: the decode step has had this since the engine section; the update had only its wall time, and
the H100 check at 10c3a31 showed it at ~80 TFLOP/s, under a tenth of the card's bf16 rate, with 29
host syncs a micro-batch. What the next change should attack is in these numbers.
"""

from __future__ import annotations

import collections
import contextlib
import time

import torch

from softtokens.gpucheck.measure import sync

HOST_READS = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy")
SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "Memcpy DtoH")
TOP_KERNELS = 12


@contextlib.contextmanager
def count_host_reads():
    """Counts the Tensor methods that read a value to the host (each a sync on a GPU) while it is open."""
    counts: collections.Counter = collections.Counter()
    real = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def wrap(name):
        def read(self, *a, **k):
            counts[name] += 1
            return real[name](self, *a, **k)
        return read

    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, wrap(name))
        yield counts
    finally:
        for name, fn in real.items():
            setattr(torch.Tensor, name, fn)


def matmul_tflops(dev: torch.device, n: int = 8192) -> float | None:
    """The card's bf16 GEMM rate, measured (n^3 multiply-adds); None on a CPU."""
    if dev.type != "cuda":
        return None
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(dev)
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(dev)
    return 10 * 2 * n ** 3 / (time.perf_counter() - t) / 1e12


def profile_update(trainer, step: int, dev: torch.device, parameters: int, checkpointing: bool) -> dict:
    """Roll out step ``step``, then time and profile its update (the loss pass and the AdamW step):
    top kernels by device time, host reads counted in Python and the profiler's sync events, achieved
    TFLOP/s against a bf16 GEMM's, and the cost forecast's update for the same shape."""
    from torch.profiler import ProfilerActivity, profile

    from softtokens.rates.throughput import DEFAULT, FLOPS_PER_PARAM_TOKEN
    from softtokens.train.update import accumulate_gradients

    rollout, _, _, adv, n, _ = trainer.rollouts(step)
    tokens = int(rollout.prompt_mask.sum() + rollout.step_ids.numel())
    micro_batches = -(-len(adv) // trainer.cfg.micro_batch_size)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    sync(dev)
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        with count_host_reads() as reads:   # the loss pass: its sums read once (train.update)
            sums = accumulate_gradients(trainer.policy, rollout, adv, n, trainer.cfg, trainer.sigma,
                                        trainer.engine.vocab_rows, trainer.gaussian_scale).over(trainer.dp)
        with count_host_reads() as step_reads:   # AdamW's step and the rollout copy's refresh
            trainer.apply_update(step, sums.loss, 0.0)
        sync(dev)
    seconds = time.perf_counter() - t0
    events = prof.key_averages()
    device_time = "device_time_total" if dev.type == "cuda" else "cpu_time_total"
    kernels = sorted((e for e in events if getattr(e, device_time, 0) > 0), key=lambda e: -getattr(e, device_time))
    total = sum(getattr(e, "self_" + device_time, 0) for e in events) or 1.0
    flops = FLOPS_PER_PARAM_TOKEN[checkpointing] * parameters * tokens
    peak = matmul_tflops(dev)
    achieved = flops / seconds / 1e12
    forecast = DEFAULT.scaled_to(parameters).update_s(trainer.cfg.mode, tokens, trainer.dp.world, checkpointing,
                                                      micro_batches)
    return {"seconds": round(seconds, 3), "tokens": tokens, "micro_batches": micro_batches,
            "micro_batch_size": trainer.cfg.micro_batch_size, "optimizer": trainer.optimizer_kind,
            "host_reads": sum(reads.values()), "host_reads_by_kind": dict(reads),
            "host_reads_optimizer_step": sum(step_reads.values()),
            "sync_events": {name: sum(e.count for e in events if e.key.startswith(name)) for name in SYNC_EVENTS},
            "tflops": float(f"{achieved:.4g}"), "card_bf16_tflops": None if peak is None else round(peak, 1),
            "share_of_card": None if peak is None else round(achieved / peak, 3),
            "forecast_seconds": round(forecast, 3), "measured_over_forecast": round(seconds / forecast, 3),
            "top_kernels": [{"name": e.key[:90], "ms": round(getattr(e, device_time) / 1e3, 2), "calls": e.count,
                             "share": round(getattr(e, "self_" + device_time, 0) / total, 3)}
                            for e in kernels[:TOP_KERNELS]]}
