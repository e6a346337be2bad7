"""What each kind of job of a grid asks the scheduler for: GPUs, CPU threads, host memory (its plan's, sizing.host),
SLURM partition and account from the environment (never the repository), and the conda environment of the GPU
rules. A part of grid.jobs.GridJobs (``job_resources``)."""

from __future__ import annotations

import os

from softtokens.config.grids import train_processes

SLURM_ENV = {"partition": "SOFTTOKENS_SLURM_PARTITION", "gpu_partition": "SOFTTOKENS_SLURM_GPU_PARTITION",
             "account": "SOFTTOKENS_SLURM_ACCOUNT"}

# Memory (MB) and time (minutes) of a job whose grid's `resources:` block does not say: on SLURM a
# job that asks for no memory is given a whole node's and jobs then run one at a time. Generous
# for the toy and small grids; the paper grid sets its own.
# A training job also asks SLURM for SIGUSR1 ten minutes before its time limit: it saves its
# resume state and exits, and the retry or requeue resumes (train.loop.Trainer.run).
DEFAULT_RESOURCES = {"train": {"mem_mb": 16000, "runtime": 720, "slurm_extra": "--signal=USR1@600"},
                     "evaluate": {"mem_mb": 16000, "runtime": 240},
                     "evaluate_loglik": {"mem_mb": 16000, "runtime": 120}, "cpu": {"mem_mb": 4000, "runtime": 60}}
GPU_KINDS = ("train", "evaluate", "evaluate_loglik")

# The order in which the scheduler starts jobs that are ready at the same time (Snakemake's `priority:`; a rule not
# named here has 0). The chain is data -> base model -> train -> select -> evaluate -> tables: the base model first
# (the paper's claims, ready at the start too, wait), a selection as soon as its run ends (a fraction of a second; it
# unblocks an evaluation), the training runs before the evaluations (the longest jobs), the tables, figures and report
# last. Without it the demo started the base model's evaluation beside its first training and a selection waited 54 s
# behind a figure (the demo 284 -> 278 s on a 2-core EPYC). On SLURM the same order is the order of submission.
PRIORITY = {"prepare_data": 40, "build_toy_base": 40, "build_packaged_base": 40, "select_checkpoint": 30,
            "train": 20, "evaluate": 10, "evaluate_loglik": 10}


def job_resources(grid: dict, kind: str, environ: dict | None = None) -> dict:
    """Resources of one kind of job from the grid's ``resources:`` block, plus the SLURM partition
    and account from the environment, so that nothing site-specific is in the repository. GPU
    jobs take SOFTTOKENS_SLURM_GPU_PARTITION, falling back to SOFTTOKENS_SLURM_PARTITION;
    an unset variable adds nothing (the plugin then uses the cluster's defaults), and
    ``--set-resources`` / ``--default-resources`` on the command line override all of it."""
    env = os.environ if environ is None else environ
    own = grid.get("resources", {}).get(kind, {})
    res = {k: v for k, v in DEFAULT_RESOURCES.get(kind, {}).items()
           if not (k == "mem_mb" and "mem_mb_per_cpu" in own)}
    res.update(own)
    partition = (env.get(SLURM_ENV["gpu_partition"]) if res.get("gpu", 0) > 0 else None) or env.get(SLURM_ENV["partition"])
    if partition:
        res["slurm_partition"] = partition
    if env.get(SLURM_ENV["account"]):
        res["slurm_account"] = env[SLURM_ENV["account"]]
    return res



class JobResources:
    """One grid's resources (``grid``: the resolved grid; ``host_mb(kind, wildcards)``: a job's host memory, or None)."""

    def __init__(self, grid: dict, environ: dict | None = None, host_mb=None):
        self.grid, self.environ, self.host_mb = grid, environ, host_mb

    def resources(self, kind: str) -> dict:
        """Resources of one kind of job (train / evaluate / evaluate_loglik / cpu). A training job
        takes its model's GPU count (models.<m>.train_gpus, chosen from the memory plan): there
        ``gpu`` is a function of the model."""
        res = job_resources(self.grid, kind, self.environ)
        if kind == "train" and res.get("gpu", 0) > 0:
            res["gpu"] = lambda model: train_processes(self.grid, model)
        if self.host_mb is not None and kind in GPU_KINDS:
            res["mem_mb"] = self._declared_memory(kind, res)
        return res

    def _declared_memory(self, kind: str, res: dict):
        """A job's mem_mb as a function of its wildcards: the host memory its plan needs (sizing.host), raised to
        what the grid's resources block asks where that is more (mem_mb, or mem_mb_per_cpu x the job's CPUs: one
        of the two is declared, never both, which SLURM refuses)."""
        own = self.grid.get("resources", {}).get(kind, {})
        res.pop("mem_mb_per_cpu", None)

        def mem_mb(wildcards) -> int:
            model = getattr(wildcards, "model", None)
            asked = own.get("mem_mb") or own.get("mem_mb_per_cpu", 0) * self.threads(kind, model)
            return max(int(asked), self.host_mb(kind, wildcards))

        return mem_mb

    def threads(self, kind: str, model: str | None = None) -> int:
        """CPU threads of a job: cpus_per_gpu x its GPUs on a GPU job (torch and the data work use
        them), else 1 (the CPU grids run many one-thread jobs side by side)."""
        res = job_resources(self.grid, kind, self.environ)
        gpus = res.get("gpu", 0)
        if kind == "train" and gpus:
            gpus = train_processes(self.grid, model)
        return int(gpus * res.get("cpus_per_gpu", 1)) if gpus else 1

    def ledger_gpus(self) -> dict:
        """GPUs held by each job, for the ledger's GPU-hours: a training job its model's
        train_gpus, an evaluation job its kind's `gpu` resource; every other rule none."""
        train = job_resources(self.grid, "train", self.environ).get("gpu", 0)
        return {"train": {m: (train_processes(self.grid, m) if train else 0) for m in self.grid["models"]},
                **{k: job_resources(self.grid, k, self.environ).get("gpu", 0) for k in GPU_KINDS[1:]}}

    def gpu_rule_env(self) -> str:
        """The conda environment of the GPU rules: torch's CUDA build pinned on a grid whose jobs ask
        for GPUs, the plain pins elsewhere (a laptop's toy grid needs no CUDA download)."""
        gpu = self.grid.get("resources", {}).get("train", {}).get("gpu")
        return "../../envs/softtokens-gpu.yaml" if gpu else "../../envs/softtokens.yaml"
