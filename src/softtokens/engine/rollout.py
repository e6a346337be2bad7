"""What a decoding call returns: every input fed, step by step, so that the update pass replays
exactly what the rollout consumed (the paper's REINFORCE gradient is through the log-probability
of those inputs) and the evaluation can read each row's text as the model produced it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from softtokens.engine.settings import EMBEDDING, CotSetting, Placement

# the phases of a row's state machine (the package docstring's diagram)
COT, PREFILL, ANSWER, DONE = 0, 1, 2, 3


@dataclass
class Rollout:
    """Everything a batch of rollouts fed the model, step by step. N rows, S steps."""

    setting: CotSetting
    sigma: float
    prompt_ids: torch.Tensor            # (N, P) left-padded
    prompt_mask: torch.Tensor           # (N, P)
    step_ids: torch.Tensor              # (N, S) token fed (continuous CoT steps: the greedy shadow)
    step_phase: torch.Tensor            # (N, S) COT / PREFILL / ANSWER / DONE
    noisy_inputs: torch.Tensor | None   # (N, S, d) float32 h~ drawn at continuous CoT steps, 0 elsewhere
                                        # (the model was fed h~ in its compute dtype)
    cot_entropy: torch.Tensor           # (N, S) entropy of softmax(logits) at CoT steps
    cot_len: torch.Tensor               # (N,)
    stopped: torch.Tensor               # (N,) bool: stop text found before the limit
    completions: list[str]              # text after the CoT: prefill + answer
    cot_texts: list[str]
    argmax_ids: torch.Tensor | None = None  # (N, S) argmax of the logits that produced each step
    placement: Placement = EMBEDDING
    row_keys: torch.Tensor | None = None    # (N,) each row's seed: the key of its counter noise (every placement)
    topk_ids: torch.Tensor | None = None    # (N, S, k) the top-k logits noised at each step (top-k placement)

    def rows(self, idx: slice | torch.Tensor) -> "Rollout":
        """A sub-batch (for micro-batched updates)."""
        pick = (lambda t: None if t is None else t[idx])
        sel = range(len(self.completions))[idx] if isinstance(idx, slice) else idx.tolist()
        return Rollout(self.setting, self.sigma, pick(self.prompt_ids), pick(self.prompt_mask),
                       pick(self.step_ids), pick(self.step_phase), pick(self.noisy_inputs),
                       pick(self.cot_entropy), pick(self.cot_len), pick(self.stopped),
                       [self.completions[i] for i in sel], [self.cot_texts[i] for i in sel], pick(self.argmax_ids),
                       self.placement, pick(self.row_keys), pick(self.topk_ids))


@dataclass
class RowResult:
    """One finished row of ``CotEngine.stream`` (tensors on the CPU, T = the row's steps)."""

    job: int
    step_ids: torch.Tensor
    step_phase: torch.Tensor
    cot_entropy: torch.Tensor
    argmax_ids: torch.Tensor
    noisy_inputs: torch.Tensor | None
    cot_len: int
    stopped: bool
    completion: str
    cot_text: str


def decode_texts(tokenizer, ids: list[list[int]], phases: list[list[int]]) -> list[tuple[str, str]]:
    """(completion, CoT text) per row: the completion is what followed the CoT (prefill + answer)."""
    out = []
    for row, phs in zip(ids, phases):
        cot = tokenizer.decode([t for t, p in zip(row, phs) if p == COT])
        completion = tokenizer.decode([t for t, p in zip(row, phs) if p in (PREFILL, ANSWER)], skip_special_tokens=True)
        out.append((completion, cot))
    return out
