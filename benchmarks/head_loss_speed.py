"""The update pass's loss and backward with the fused head (train.head_loss: the head once, its weight
gradients summed in float32) against the checkpointed path (the head again in the backward, a weight
gradient per chunk), in the same process, on a head-dominated model (V / d = 64; the paper's Llama-3.2-3B
has 42), for hard and soft tokens.

    python benchmarks/head_loss_speed.py [--vocab 16384 --hidden 256 --rows 8 --steps 256 --repeats 5]

Prints one JSON object: per mode, the median seconds of each path, fused / checkpointed, the largest
relative gradient difference and the peak memory of each (CUDA: max_memory_allocated, bf16, the paper's
path; CPU: the profiler's allocation events). ``--out FILE``: the object is also written there after each
mode, atomically, so a run cut by a time limit leaves what it measured.
"""

from __future__ import annotations

import argparse
import json

import torch

from softtokens.gpucheck.head_check import (
    head_ab,
    synthetic_rollout,  # noqa: F401
)
from softtokens.gpucheck.head_check import run_once as run  # noqa: F401  (tests/test_head_loss.py reads them here)


def cpu_peak_bytes(fn) -> int:
    """The most bytes of CPU tensors alive at once while ``fn`` runs, above what was alive before it
    (torch.profiler's allocation events, in order): the CPU stand-in for torch.cuda.max_memory_allocated."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += e.self_cpu_memory_usage   # its own allocations and frees (a parent op repeats its children's)
        peak = max(peak, live)
    return peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="also write the JSON here after each repeat (a cut run keeps it)")
    a = ap.parse_args()
    from softtokens.store.files import write_json

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "complete": False}

    def written():
        if a.out:
            write_json(a.out, out)
    head_ab(out, a.vocab, a.hidden, a.rows, a.steps, a.repeats, dev, on_result=written)
    out["complete"] = True
    written()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
