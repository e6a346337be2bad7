"""The record of a decoding call: at each row's step column, the token fed, its phase, the
argmax, the CoT entropy and, for training rollouts, the continuous input fed. Written with one
flat index_copy_ per tensor, finished rows into a discard column, so that the step has fixed
shapes and needs no host look at which rows are live."""

from __future__ import annotations

import torch

from softtokens.engine.rollout import DONE, Rollout, RowResult, decode_texts


class StepRecord:
    """Per-row, per-step records of ``slots`` rows over at most ``steps`` steps."""

    def __init__(self, slots: int, steps: int, dim: int, pad_id: int, input_dtype: torch.dtype,
                 record_inputs: bool, top_k: int, dev: torch.device):
        self.steps, self.dim, self.pad_id, self.top_k = steps, dim, pad_id, top_k
        width = steps + 1  # column ``steps`` is where finished rows write (discarded)
        long = dict(dtype=torch.long, device=dev)
        self.ids = torch.full((slots, width), pad_id, **long)
        self.phase = torch.full((slots, width), DONE, dtype=torch.int8, device=dev)
        self.argmax = torch.full((slots, width), pad_id, **long)
        self.entropy = torch.zeros(slots, width, device=dev)
        self.inputs = torch.zeros(slots, width, dim, dtype=input_dtype, device=dev) if record_inputs else None
        self.topk = torch.zeros(slots, width, top_k, **long) if record_inputs and top_k else None

    def clear(self, idx: torch.Tensor) -> None:
        self.ids[idx] = self.pad_id
        self.phase[idx] = DONE
        self.argmax[idx] = self.pad_id
        self.entropy[idx] = 0.0
        if self.inputs is not None:
            self.inputs[idx] = 0.0
        if self.topk is not None:
            self.topk[idx] = 0

    def write(self, rows: torch.Tensor, live: torch.Tensor, step: torch.Tensor, is_cot: torch.Tensor,
              phase: torch.Tensor, tok: torch.Tensor, argmax: torch.Tensor, entropy: torch.Tensor,
              mix: torch.Tensor | None, topk_ids: torch.Tensor | None) -> None:
        """Record one step at each live row's column ``step`` (CoT-only fields are 0 elsewhere)."""
        flat = rows * (self.steps + 1) + torch.where(live, step, self.steps)
        self.ids.view(-1).index_copy_(0, flat, tok)
        self.phase.view(-1).index_copy_(0, flat, phase.to(torch.int8))
        self.argmax.view(-1).index_copy_(0, flat, argmax)
        self.entropy.view(-1).index_copy_(0, flat, torch.where(is_cot, entropy, 0.0))
        if self.inputs is not None:
            self.inputs.view(-1, self.dim).index_copy_(0, flat, torch.where(is_cot.unsqueeze(-1), mix, 0.0))
        if self.topk is not None:
            self.topk.view(-1, self.top_k).index_copy_(0, flat, topk_ids)

    def rows(self, tokenizer, idx: torch.Tensor, steps: list[int], cot_len: list[int],
             stopped: list[bool]) -> list[RowResult]:
        """Rows ``idx`` as finished results on the CPU (``steps``: each one's step count)."""
        width = max(steps)
        ids, phase = self.ids[idx, :width].cpu(), self.phase[idx, :width].cpu()
        entropy, argmax = self.entropy[idx, :width].cpu(), self.argmax[idx, :width].cpu()
        inputs = self.inputs[idx, :width].cpu() if self.inputs is not None else None
        texts = decode_texts(tokenizer, ids.tolist(), phase.tolist())
        return [RowResult(-1, ids[i, :t], phase[i, :t], entropy[i, :t], argmax[i, :t],
                          None if inputs is None else inputs[i, :t], cot_len[i], stopped[i], *texts[i])
                for i, t in enumerate(steps)]

    def rollout(self, tokenizer, used: int, **fields) -> Rollout:
        """All rows' first ``used`` steps as a training Rollout (``fields``: the rest of it)."""
        texts = decode_texts(tokenizer, self.ids[:, :used].tolist(), self.phase[:, :used].tolist())
        return Rollout(step_ids=self.ids[:, :used].clone(), step_phase=self.phase[:, :used].clone(),
                       noisy_inputs=None if self.inputs is None else self.inputs[:, :used].clone(),
                       cot_entropy=self.entropy[:, :used].clone(), completions=[c for c, _ in texts],
                       cot_texts=[t for _, t in texts], argmax_ids=self.argmax[:, :used].clone(),
                       topk_ids=None if self.topk is None else self.topk[:, :used].clone(), **fields)
