"""Data parallelism inside one training job: ``accelerate launch`` starts one process per GPU,
each decodes and back-propagates its share of the step's B x G rollouts, and gradients are
summed across processes before the optimiser step.

With one process (CPU, a laptop, one GPU) every call here is a no-op, so the training loop is
the same code everywhere. Rollout randomness is seeded per row from global indices, so the
rollouts of a step do not depend on the number of processes; only the order of floating-point
additions in the gradient sum does.
"""

from __future__ import annotations

import torch


class DataParallel:
    def __init__(self):
        import os

        from accelerate import PartialState

        # joins the process group that `accelerate launch` / torchrun set up (gloo on CPU, nccl on GPU)
        self.state = PartialState(cpu=not torch.cuda.is_available())
        self.rank, self.world = self.state.process_index, self.state.num_processes
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched != self.world:  # every process would think it is alone and write the same files
            raise RuntimeError(f"launched as {launched} processes but joined a group of {self.world}")
        self.is_main = self.state.is_main_process

    @property
    def device(self) -> torch.device:
        from softtokens.modeling import pick_device

        return pick_device() if self.world == 1 else self.state.device

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

    def sum(self, values: list[float], device: torch.device) -> list[float]:
        """Element-wise sum of a list of numbers over processes."""
        if self.world == 1:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.tolist()

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum .grad over processes (each process's loss is already divided by the global row count)."""
        if self.world == 1:
            return
        import torch.distributed as dist

        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)

    def barrier(self) -> None:
        if self.world > 1:
            self.state.wait_for_everyone()

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            self.barrier()
            dist.destroy_process_group()
