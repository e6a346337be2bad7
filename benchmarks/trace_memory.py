"""The training update's memory traced through the project's own code on a CPU, beside the plan (sizing.plan): a
model of the job's architecture built under FakeTensorMode (no weights, no compute), sharded by train.sharding's
shard_policy over a fake process group at the job's world size (rank 0: the largest shard), AdamW from
train.optimizer, the rollout copy (every parameter in bf16: rollout_copy's bytes), and the RLOO replay loss of a synthetic rollout
(gpucheck.head_check.synthetic_rollout) by train.update.accumulate_gradients, one micro-batch per call, gradients
held; torch's MemTracker counts every tensor per phase. A first step allocates AdamW's state; the second is traced:
held (master shard, AdamW state, rollout copy), the first and second micro-batch of the update, the optimizer step.

A first step of issue 71 (the traced plan): the update's phases only, and a benchmark, not `plan --trace` yet. What a
CPU trace cannot see (CUDA kernels' workspaces, NCCL buffers, the allocator's fragmentation) is not in it.

    python benchmarks/trace_memory.py --model meta-llama/Llama-3.2-3B-Instruct --processes 2 --micro-batch 8 \\
        --cot 128 --layers 4 --out benchmarks/results/trace_memory_HOST.json
"""

from __future__ import annotations

import argparse
import json
import time
import types
from pathlib import Path

GB = 1e9


def traced_phases(source: str, processes: int, micro_batch: int, prompt: int, cot: int, answer: int, layers: int | None,
                  mode: str, optimizer: str, checkpointing: bool = False) -> tuple[dict, object]:
    """{phase: bytes} of rank 0 and the (reduced-depth) architecture traced."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import AutoConfig, AutoModelForCausalLM

    from softtokens.engine.settings import INFERENCE_SETTINGS
    from softtokens.gpucheck.head_check import synthetic_rollout
    from softtokens.sizing.plan import _from_config_json, architecture_file
    from softtokens.train.optimizer import adamw
    from softtokens.train.sharding import shard_policy
    from softtokens.train.update import accumulate_gradients

    fields = json.loads(architecture_file(source).read_text())
    if layers:
        fields["num_hidden_layers"] = layers
    arch = _from_config_json(json.dumps(fields), source)
    config = AutoConfig.for_model(**fields)
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=processes, store=FakeStore())
    mesh = init_device_mesh("cpu", (processes,))   # outside the fake mode: the mesh reads its ranks
    setting = INFERENCE_SETTINGS[f"{mode}_sample"]
    rows = micro_batch
    steps = cot + answer
    cfg = types.SimpleNamespace(micro_batch_size=micro_batch, answer_temperature=1.0, replay_logit_tolerance=0.0)
    out: dict[str, float] = {}

    def total(snapshot) -> float:
        return float(sum(v["Total"] for v in snapshot.values()))

    def reset_peak(tracker) -> None:   # MemTracker keeps one peak; each phase reads its own
        tracker._peak_mem, tracker._peak_mem_snap = {}, {}

    with FakeTensorMode(allow_non_fake_inputs=True):
        lm = AutoModelForCausalLM.from_config(config)
        unique = list({id(p): p for p in lm.parameters()}.values())
        policy = shard_policy(lm, mesh, "bfloat16", "float32", checkpointing)
        opt, _ = adamw(policy.parameters(), 1e-6, (0.9, 0.999), 1e-8, 0.0, optimizer)
        tracker = MemTracker()
        tracker.track_external(policy, opt)
        with tracker:
            # the rollout copy: every parameter in bf16 (train.sharding.rollout_copy's module move cannot run under
            # fake tensors; its bytes are these)
            copy = [torch.empty(p.shape, dtype=torch.bfloat16) for p in unique]
            for step in range(2):
                reset_peak(tracker)
                if step:
                    out["held"] = total(tracker.get_tracker_snapshot("current"))
                for mb in range(2):
                    rollout = synthetic_rollout(setting, rows, prompt, steps, arch.vocab, arch.hidden,
                                                torch.device("cpu"))
                    accumulate_gradients(policy, rollout, torch.linspace(-1, 1, rows), 2 * rows * processes, cfg,
                                         0.02, arch.vocab, 1.0)
                    tracker.reset_mod_stats()
                    if step:
                        out[f"update, micro-batch {mb + 1}"] = total(tracker.get_tracker_snapshot("peak"))
                    del rollout
                    reset_peak(tracker)
                opt.step()
                if step:
                    out["optimizer step"] = total(tracker.get_tracker_snapshot("peak"))
                opt.zero_grad(set_to_none=True)
            del copy
    return out, arch


def planned_phases(arch, processes: int, micro_batch: int, prompt: int, cot: int, answer: int, mode: str,
                   optimizer: str, checkpointing: bool = False) -> dict:
    from softtokens.data.prompt import PREFILL_TOKENS
    from softtokens.sizing.plan import TrainJob, train_memory

    job = TrainJob(processes=processes, rows=2 * micro_batch * processes, micro_batch=micro_batch,
                   prompt_tokens=prompt, cot_tokens=cot - PREFILL_TOKENS, answer_tokens=answer,
                   continuous=mode != "hard", optimizer=optimizer, checkpointing=checkpointing)
    m = train_memory(arch, job)
    return {"held": m["held"], "update, micro-batch 1": m["backward"] - m["gradients"],
            "update, micro-batch 2": m["backward"], "optimizer step": m["optimizer step"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="meta-llama/Llama-3.2-3B-Instruct")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--cot", type=int, default=128)
    parser.add_argument("--answer", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4, help="decoder layers traced (the plan is computed at the same)")
    parser.add_argument("--mode", default="soft", choices=("hard", "soft", "fuzzy"))
    parser.add_argument("--optimizer", default="foreach", choices=("foreach", "fused"))
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing (train.sharding)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    start = time.perf_counter()
    traced, arch = traced_phases(args.model, args.processes, args.micro_batch, args.prompt, args.cot, args.answer,
                                 args.layers, args.mode, args.optimizer, args.checkpointing)
    planned = planned_phases(arch, args.processes, args.micro_batch, args.prompt, args.cot, args.answer, args.mode,
                             args.optimizer, args.checkpointing)
    seconds = time.perf_counter() - start
    job = (f"{args.model} x {arch.layers} layers, {args.processes} processes, micro-batch {args.micro_batch}, "
           f"prompt {args.prompt}, CoT {args.cot}, {args.mode}{', checkpointing' if args.checkpointing else ''}")
    lines = ["| job | phase | planned GB | traced GB | traced / planned |", "|---|---|---|---|---|"]
    rows = []
    for phase, t in traced.items():
        p = planned[phase]
        lines.append(f"| {job} | {phase} | {p / GB:.3f} | {t / GB:.3f} | {t / p:.3f} |")
        rows.append({"phase": phase, "planned_gb": round(p / GB, 4), "traced_gb": round(t / GB, 4),
                     "ratio": round(t / p, 4)})
    print("\n".join(lines))
    print(f"traced in {seconds:.1f} s")
    if args.out:
        from softtokens.store.provenance import device

        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"job": job, "args": vars(args) | {"out": str(args.out)}, "device": device(),
                                        "seconds": round(seconds, 1), "phases": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
