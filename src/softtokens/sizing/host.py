"""Host memory a job needs, from the same plan as its GPU memory (sizing.plan), so that a job declares what it
will hold: on a laptop Snakemake then never starts jobs whose sum exceeds the machine (a 24 GB machine once ran
two 11 GB training jobs of a 135M model at once and the kernel killed one), and on a cluster the SLURM request
covers the job's peak.

Where a job computes on the CPU (the toy and real grids), every term of the device plan is host memory. Where it
computes on a GPU, the host holds, per process: the model as it loads (float32, on the CPU, before it is sharded
and moved: train.loop) and, later, a save's staging copy (the process's shard of the weights and of AdamW's two
moments, float32: train.saving). Either way a process holds its interpreter with torch, transformers and
softtokens imported (PROCESS_BYTES, measured at 0.39 GB) and a grading worker (GRADER_BYTES).

HOST_MARGIN is kept between the plan and what is declared: the CPU allocator's fragmentation is not in the plan
(measured on SmolLM2-135M, 2 x 4 rows, micro-batch 8: max RSS 5.3-5.8 GB for a planned 6.5 GB update peak)."""

from __future__ import annotations

import math

from softtokens.sizing.plan import (
    BYTES,
    GB,
    LOOP_PHASES,
    Architecture,
    TrainJob,
    eval_memory,
    loglik_memory,
    sharded_bytes,
    train_memory,
)

PROCESS_BYTES = 0.6e9   # python, torch, transformers and softtokens imported: 0.39 GB RSS measured, rounded up
GRADER_BYTES = 0.3e9    # the grading pool's worker process (math-verify, sympy)
HOST_MARGIN = 1.1       # allocator fragmentation and what the plan does not count
MB = 1e6


def loading_bytes(arch: Architecture, param_dtype_bytes: int = 4) -> int:
    """A model as from_pretrained builds it on the CPU, in the load dtype, and the largest tensor read beside it
    (safetensors hands each tensor over as it is read). The rollout copy is made one tensor at a time in the
    compute dtype, on the device (train.sharding.rollout_copy): no second host copy of the model."""
    return (arch.parameters + max(math.prod(s) for s in arch.shapes)) * param_dtype_bytes


def train_host(arch: Architecture, job: TrainJob, on_gpu: bool, main: bool = True, graders: int = 1) -> dict[str, float]:
    """Bytes of host memory per training process, by phase, and the peak; ``main``: the process that writes the
    saves (it holds the consolidated weights of a staged save: train.saving); ``graders``: its grading workers."""
    base = PROCESS_BYTES + graders * GRADER_BYTES
    m = {"process": base, "loading": base + loading_bytes(arch)}
    if on_gpu:
        shard = sharded_bytes(arch, job.processes, 4)
        # a save staged in host memory: every process its AdamW shards (two moments, float32); the main one the
        # consolidated float32 weights too
        m["staging a save"] = base + 2 * shard + (arch.parameters * 4 if main else 0)
    else:   # every phase of the loop on the host (sizing.plan.LOOP_PHASES)
        device = train_memory(arch, job)
        for phase in LOOP_PHASES:
            m[phase] = base + device[phase]
    m["peak"] = max(m.values())
    return m


def eval_host(arch: Architecture, on_gpu: bool, batch: int, prompt_tokens: int, cot_tokens: int,
              answer_tokens: int, compute_dtype: str) -> dict[str, float]:
    """Bytes of host memory of an evaluation (math, under one or every inference setting)."""
    base = PROCESS_BYTES + GRADER_BYTES
    m = {"loading": base + loading_bytes(arch, BYTES[compute_dtype])}   # loaded in the compute dtype (eval.math_eval)
    if not on_gpu:
        m["decoding"] = base + eval_memory(arch, batch, prompt_tokens, cot_tokens, answer_tokens, compute_dtype)["peak"]
    m["peak"] = max(m.values())
    return m


def loglik_host(arch: Architecture, on_gpu: bool, batch: int, prompt_tokens: int, compute_dtype: str) -> dict:
    base = PROCESS_BYTES
    m = {"loading": base + loading_bytes(arch, BYTES[compute_dtype])}
    if not on_gpu:
        m["scoring"] = base + loglik_memory(arch, batch, prompt_tokens, compute_dtype=compute_dtype)["peak"]
    m["peak"] = max(m.values())
    return m


def declared_mb(peak_bytes: float) -> int:
    """What a job declares (Snakemake's mem_mb, the SLURM request): its peak with HOST_MARGIN, in 100 MB."""
    return int(math.ceil(peak_bytes * HOST_MARGIN / MB / 100) * 100)


def gb(n: float) -> str:
    return f"{n / GB:.1f} GB"


# ---------------------------------------------------------------- a grid's jobs
class HostPlan:
    """Each job's host memory in one grid (what grid.jobs.GridJobs declares as its mem_mb)."""

    def __init__(self, config: dict, grid_name: str):
        from softtokens.config.grids import EVAL_DEFAULTS, resolved_rl

        self.config, self.name = config, grid_name
        self.grid = config["grids"][grid_name]
        self.on_gpu = bool(self.grid.get("resources", {}).get("train", {}).get("gpu"))
        self.prompt = int(self.grid.get("memory_plan", {}).get("prompt_tokens", 512))
        self.eval = {**EVAL_DEFAULTS, **self.grid["evaluation"]}
        self.rl = resolved_rl(config, grid_name)
        # a training process's grading workers: its share of the job's CPUs (reward.pool.pool_size)
        from softtokens.reward.pool import pool_size

        train = self.grid.get("resources", {}).get("train", {})
        self.graders = pool_size(int(train.get("cpus_per_gpu", 1)) if self.on_gpu else 1)

    def train(self, model: str, dataset: str, arm: str, main: bool = True) -> dict[str, float]:
        from softtokens.config.grids import cell_grid, cell_rl
        from softtokens.store.paths import parse_arm
        from softtokens.sizing.plan import grid_architecture, resolve_memory, train_job_for

        mode, variant = parse_arm(arm)
        grid = cell_grid(self.config, self.name, model, dataset, variant)   # another grid's name: its settings
        rl = resolve_memory(self.config, grid, model, cell_rl(self.config, grid, model, dataset, variant),
                            mode != "hard")
        job = train_job_for(self.grid, model, rl, self.prompt, mode != "hard", rl["micro_batch_size"],
                            bool(rl["activation_checkpointing"]))
        return train_host(grid_architecture(self.grid, model), job, self.on_gpu, main, self.graders)

    def evaluate(self, model: str) -> dict[str, float]:
        from softtokens.sizing.plan import grid_architecture

        ev = self.eval
        return eval_host(grid_architecture(self.grid, model), self.on_gpu, ev["batch_size"], self.prompt,
                         ev["cot_max_tokens"], ev["answer_max_tokens"], self.rl["compute_dtype"])

    def loglik(self, model: str) -> dict[str, float]:
        from softtokens.sizing.plan import grid_architecture

        return loglik_host(grid_architecture(self.grid, model), self.on_gpu, self.eval["loglik_batch_size"],
                           self.prompt, self.rl["compute_dtype"])

    def train_job_bytes(self, model: str, dataset: str, arm: str) -> float:
        """A training job's host peak over all its processes: they load at once; the main one stages the saves."""
        from softtokens.config.grids import train_processes

        main = self.train(model, dataset, arm)
        if not self.on_gpu:
            return main["peak"]
        n, other = train_processes(self.grid, model), self.train(model, dataset, arm, main=False)
        # every process loads at once; later, a save is staged on each (the main one holds the weights too)
        return max(n * main["loading"], main["staging a save"] + (n - 1) * other["staging a save"])

    def mb(self, kind: str, wildcards) -> int:
        """The mem_mb a job of ``kind`` declares, from its wildcards (model, dataset, arm)."""
        if kind == "train":
            return declared_mb(self.train_job_bytes(wildcards.model, wildcards.dataset, wildcards.arm))
        if kind == "evaluate" and not self.eval["one_job_per_setting"]:   # one job: both phases, one after another
            return declared_mb(max(self.evaluate(wildcards.model)["peak"], self.loglik(wildcards.model)["peak"]))
        peak = (self.evaluate if kind == "evaluate" else self.loglik)(wildcards.model)["peak"]
        return declared_mb(peak)


def machine_memory() -> tuple[int, int]:
    """(total, available) bytes of this machine for a new process: /proc/meminfo's MemTotal and MemAvailable,
    lowered to the cgroup's limit where a container or a SLURM allocation sets one (cgroup v2 memory.max)."""
    info = {}
    try:
        for line in open("/proc/meminfo"):
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0]) * 1024
    except OSError:
        return 0, 0
    total, available = info.get("MemTotal", 0), info.get("MemAvailable", info.get("MemFree", 0))
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        used = int(open("/sys/fs/cgroup/memory.current").read().strip())
        if limit != "max":
            total = min(total, int(limit))
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return total, max(available, 0)
