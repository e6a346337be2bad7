"""The process group of one training job: ``accelerate launch`` / ``torchrun`` start one
process per GPU; a lone process (CPU, a laptop, one GPU) joins a group of one through an
in-process store. So there is one code path: FSDP (softtokens.sharding) shards parameters,
gradients and optimizer state over the group, whatever its size.

Rollout rows are split over processes in contiguous blocks; their randomness is seeded per
row from global indices, so the rollouts of a step do not depend on the number of processes.
"""

from __future__ import annotations

import os

import torch


class DataParallel:
    def __init__(self):
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        launched = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            if local_rank >= torch.cuda.device_count():  # two processes on one GPU: NCCL refuses, later and vaguely
                raise RuntimeError(f"process {local_rank} of {launched} on this node, but {torch.cuda.device_count()} "
                                   "GPU(s) visible: launch one process per GPU (train_gpus, --nproc-per-node)")
            self.device = torch.device("cuda", local_rank)
            torch.cuda.set_device(self.device)
            backend = "nccl"
        else:
            self.device = torch.device("cpu")
            backend = "gloo"
        if not dist.is_initialized():
            if launched == 1:  # a group of one: no launcher, no rendezvous, no port
                dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            else:  # env:// set by torchrun / accelerate launch
                dist.init_process_group(backend, device_id=self.device if backend == "nccl" else None)
        self.world = dist.get_world_size()
        if launched != self.world:  # every process would think it is alone and write the same files
            raise RuntimeError(f"launched as {launched} processes but joined a group of {self.world}")
        self.rank = dist.get_rank()
        self.is_main = self.rank == 0
        self.mesh = init_device_mesh(self.device.type, (self.world,))
        # a group of its own for the background saves' collectives (train.resume: dcp.async_save plans and
        # finishes in a thread while training runs collectives on the default group, which two threads may not
        # share); gloo, so a save's host-side coordination never waits behind NCCL kernels
        self.save_group = dist.new_group(backend="gloo")

    def _block(self, rank: int, n: int) -> slice:
        per, extra = divmod(n, self.world)
        start = rank * per + min(rank, extra)
        return slice(start, start + per + (1 if rank < extra else 0))

    def shard(self, n: int) -> slice:
        """This process's contiguous block of ``n`` rows (blocks differ by at most one row)."""
        return self._block(self.rank, n)

    def gather_rows(self, local: torch.Tensor, n: int) -> torch.Tensor:
        """The full (n, ...) tensor from each process's ``shard(n)`` block, in global order."""
        if self.world == 1:
            return local
        import torch.distributed as dist

        per = -(-n // self.world)
        padded = torch.zeros((per, *local.shape[1:]), dtype=local.dtype, device=local.device)
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        dist.all_gather(parts, padded)
        blocks = [self._block(r, n) for r in range(self.world)]
        return torch.cat([p[: b.stop - b.start] for p, b in zip(parts, blocks)])

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of a list of numbers over processes."""
        if self.world == 1:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def max(self, values: list[float]) -> list[float]:
        """Element-wise maximum of a list of numbers over processes."""
        if self.world == 1:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor summed over processes, on the device (no host read)."""
        if self.world > 1:
            import torch.distributed as dist

            t = t.clone()
            dist.all_reduce(t)
        return t

    def max_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor's element-wise maximum over processes, on the device (no host read)."""
        if self.world > 1:
            import torch.distributed as dist

            t = t.clone()
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    def gather_objects(self, obj) -> list:
        """Every process's ``obj`` (picklable), in rank order, on every process (a rare event's details: a
        failure's message; never on a hot path)."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            self.barrier()
            dist.destroy_process_group()
