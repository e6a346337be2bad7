"""Every row's place in the decoding state machine (the package docstring's diagram), as device
tensors advanced for all rows at once: no host round-trip per step, so a step can be captured
in a CUDA graph. The reference loop (reference.py) runs the same machine in Python, per row."""

from __future__ import annotations

import torch

from softtokens.engine.rollout import ANSWER, COT, DONE, PREFILL


class RowStates:
    """Phase, positions, prefill queue and stop-automaton state of ``slots`` rows."""

    def __init__(self, engine, slots: int, cot_max: int, answer_max: int, vocab: int, dev: torch.device):
        self.cot_max, self.answer_max, self.pad_id = cot_max, answer_max, engine.pad_id
        long = dict(dtype=torch.long, device=dev)
        self.phase = torch.full((slots,), DONE, **long)
        self.cot_pos, self.ans_pos, self.queue_pos, self.queue_kind, self.stop_state, self.step_count = (
            torch.zeros(slots, **long) for _ in range(6))
        self.stopped = torch.zeros(slots, dtype=torch.bool, device=dev)
        # the two prefill queues: after the stop text (kind 0) and at the CoT limit (kind 1)
        queues = [engine.prefill_stop, engine.prefill_limit]
        width = max(map(len, queues))
        self.queues = torch.tensor([q + [engine.pad_id] * (width - len(q)) for q in queues], **long)
        self.queue_len = torch.tensor([len(q) for q in queues], **long)
        self.stop_table = engine.stop_rule.table.to(dev)
        self.accepting = engine.stop_rule.accepting.to(dev)
        self.is_eos = torch.zeros(vocab, dtype=torch.bool, device=dev)
        self.is_eos[[t for t in engine.eos_ids if t < vocab]] = True

    def start(self, idx: torch.Tensor) -> None:
        """Rows ``idx`` begin their CoT."""
        self.phase[idx] = COT
        for t in (self.cot_pos, self.ans_pos, self.queue_pos, self.queue_kind, self.stop_state, self.step_count):
            t[idx] = 0
        self.stopped[idx] = False

    def masks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(live, at a CoT step, at a prefill step, at an answer step), one bool per row."""
        phase = self.phase
        return phase != DONE, phase == COT, phase == PREFILL, phase == ANSWER

    def queued_token(self, is_pre: torch.Tensor) -> torch.Tensor:
        """The prefill token of rows at a prefill step, padding elsewhere."""
        return torch.where(is_pre, self.queues[self.queue_kind, self.queue_pos.clamp(max=self.queues.shape[1] - 1)],
                           self.pad_id)

    def cot_index(self) -> torch.Tensor:
        return self.cot_pos.clamp(max=self.cot_max - 1)

    def answer_index(self) -> torch.Tensor:
        return self.ans_pos.clamp(max=self.answer_max - 1)

    def advance(self, tok: torch.Tensor) -> None:
        """Each row's transition after it was fed ``tok`` (the shadow token at a CoT step)."""
        live, is_cot, is_pre, is_ans = self.masks()
        self.step_count += live
        state = self.stop_table[tok, self.stop_state].long()
        self.stop_state.copy_(torch.where(is_cot, state, self.stop_state))
        self.cot_pos += is_cot
        hit_stop = is_cot & self.accepting[self.stop_state]
        hit_limit = is_cot & ~hit_stop & (self.cot_pos >= self.cot_max)
        self.stopped |= hit_stop
        self.queue_kind.copy_(torch.where(hit_limit, 1, torch.where(hit_stop, 0, self.queue_kind)))
        self.queue_pos += is_pre
        self.ans_pos += is_ans
        ans_done = is_ans & (self.is_eos[tok] | (self.ans_pos >= self.answer_max))
        new_phase = torch.where(hit_stop | hit_limit, PREFILL, self.phase)
        new_phase = torch.where(ans_done, DONE, new_phase)
        exhausted = (new_phase == PREFILL) & (self.queue_pos >= self.queue_len[self.queue_kind])
        self.phase.copy_(torch.where(exhausted, ANSWER, new_phase))
