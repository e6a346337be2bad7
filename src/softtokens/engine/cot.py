"""The fast CoT engine: every setting of the paper through one decode loop whose step runs on
the device (docs/engine.md, "Rollout engine"). Training rollouts (``generate``) start B x G rows
together; evaluation (``stream``) pushes many jobs through a fixed number of slots, refilling
them as rows finish, so the batch stays full while CoT lengths differ by an order of magnitude."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from softtokens.data.prompt import PROMPT_HEAD
from softtokens.engine import decode_forward, fused
from softtokens.engine.base import CotEngineBase
from softtokens.engine.decode_run import DecodeRun
from softtokens.engine.rollout import Rollout, RowResult
from softtokens.engine.settings import EMBEDDING, CotSetting, Placement

REFILL_GROUPS = 8  # stream admits finished slots in groups of batch_size / REFILL_GROUPS


# a shared prefix shorter than this is prefilled with each prompt: the split attention's extra
# operations cost more than the few columns they save (the toy's preamble is one token)
MIN_SHARED_TOKENS = 16


class CotEngine(CotEngineBase):
    """Decodes prompt -> CoT -> prefill -> answer for one model and tokenizer.

    A preallocated per-slot KV cache (kvcache.py) and a decode step with fixed shapes that runs
    the whole state machine on the device: phases, positions, the prefill queues, per-row
    randomness drawn at admission, and the stop rule as a token-level automaton (stoprule.py). The host looks at the rows every ``check_every`` steps
    (every step on a CPU, where a look costs nothing), to end the loop or refill finished slots;
    a finished row only writes to a discard column, so the check interval never changes results.
    On CUDA the step is captured once in a CUDA graph and replayed.
    ``reference.ReferenceCotEngine`` is the plain loop it reproduces.

    ``shared_prefix``: text the prompts start with (default: the prompt template's instruction,
    data.prompt.PROMPT_HEAD). The tokens a call's prompts all share with it are prefilled once
    per call and read once per decode step for the whole batch (kvcache.py); None turns it off. It is
    fixed text, not whatever a batch's prompts happen to share, so that a row's arithmetic does
    not depend on the rows it is batched with.

    ``fuse_elementwise``: a decode layer's norms, residual adds, rotary and gated product compiled
    into four kernels (fused.py); default: where the step is captured in CUDA graphs (there the
    compiled kernels cost no host time per step), never on a CPU (the toy's numbers do not depend on
    a compiler). ``fusion_status`` says whether it is on, or why not."""

    def __init__(self, model, tokenizer, check_every: int | None = None, fixed_shapes: bool | None = None,
                 cuda_graphs: bool = True, shared_prefix: str | None = PROMPT_HEAD,
                 fuse_elementwise: bool | None = None):
        super().__init__(model, tokenizer)
        on_cuda = model.device.type == "cuda"
        self.check_every = check_every or (8 if on_cuda else 1)
        # fixed shapes: the attention reads the whole preallocated cache (masked), as a captured
        # graph needs; elsewhere it reads only the columns some row has reached
        self.fixed_shapes = on_cuda if fixed_shapes is None else fixed_shapes
        self.cuda_graphs = cuda_graphs and on_cuda and self.fixed_shapes
        self.fast_forward = decode_forward.supports(model)
        # the decode step's attention: torch's fused kernel on CUDA, HF's eager arithmetic elsewhere
        self.attention = decode_forward.default_attention(model.device)
        fuse = self.cuda_graphs if fuse_elementwise is None else fuse_elementwise
        self.elementwise, self.fusion_status = fused.choose(model, fuse and self.fast_forward)
        # how the last decoding call ran: "captured" in a CUDA graph, or why not (gpu-check reports it)
        self.graph_status = "not run"
        self.shared_ids = tokenizer(shared_prefix)["input_ids"] if shared_prefix else []
        self.stream_stats: dict[str, int] = {}  # decode steps, slot-steps paid, slot-steps of live rows

    def shared_tokens(self, prompt_ids: list[list[int]]) -> list[int]:
        """The leading tokens of ``shared_ids`` that every prompt starts with, leaving each prompt at
        least one token of its own (the one whose logits start the CoT); none if fewer than
        MIN_SHARED_TOKENS. A prompt's last shared token may differ from the prefix's own
        tokenization (BPE merges it with the question's first word): the common part is used."""
        n = min([len(self.shared_ids)] + [len(ids) - 1 for ids in prompt_ids])
        for ids in prompt_ids:
            n = next((j for j in range(n) if ids[j] != self.shared_ids[j]), n)
        return self.shared_ids[:n] if n >= MIN_SHARED_TOKENS else []

    @torch.no_grad()
    def generate(self, prompts: list[str], setting: CotSetting, sigma: float, seeds: list[int],
                 cot_max_tokens: int, answer_max_tokens: int, answer_temperature: float = 0.0,
                 placement: Placement = EMBEDDING) -> Rollout:
        """All rows at once, until the last one ends (training rollouts, whose B x G rows start
        together); the Rollout records every input fed, for the update pass."""
        prompt_ids, prompt_mask = self.encode_prompts(prompts)
        shared = self.shared_tokens([row[m.bool()].tolist() for row, m in zip(prompt_ids.cpu(), prompt_mask.cpu())])
        run = DecodeRun(self, setting, sigma, cot_max_tokens, answer_max_tokens, answer_temperature,
                         slots=len(prompts), max_prompt=prompt_ids.shape[1], record_inputs=True, placement=placement,
                         shared=shared)
        run.admit(list(range(len(prompts))), prompt_ids, prompt_mask, seeds)
        while run.live_slots():
            run.steps(self.check_every)
        return run.rollout(prompt_ids, prompt_mask)

    @torch.no_grad()
    def stream(self, prompts: list[str], seeds: list[int], setting: CotSetting, sigma: float, cot_max_tokens: int,
               answer_max_tokens: int, answer_temperature: float = 0.0, batch_size: int = 64,
               refill: bool = True, placement: Placement = EMBEDDING,
               admit_min: int | None = None) -> Iterator[RowResult]:
        """Decode many (prompt, seed) jobs through ``batch_size`` slots, yielding each row as it
        finishes (in finishing order; ``RowResult.job`` is its index). With ``refill`` finished
        slots take the next pending jobs once ``admit_min`` of them are free (default: an eighth
        of the batch; or as many as there are pending jobs), so the batch stays nearly full;
        without it, a new wave starts when the whole batch has finished (the old behaviour, for
        comparison). Why not at once: every admission runs one prefill forward, and short CoTs end
        a few rows at a time; admitting each as it ended cost more than the decode steps refill
        saves (docs/engine.md). A row's result does not depend on which rows share its
        batch, nor on when it was admitted."""
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt")
        if not prompts:
            return
        tokenized = self.tokenizer(prompts)["input_ids"]
        slots = min(batch_size, len(prompts))
        admit_min = max(1, slots // REFILL_GROUPS if admit_min is None else admit_min)
        run = DecodeRun(self, setting, sigma, cot_max_tokens, answer_max_tokens, answer_temperature,
                         slots=slots, max_prompt=max(map(len, tokenized)), record_inputs=False, placement=placement,
                         shared=self.shared_tokens(tokenized))
        self.stream_stats = {"decode_steps": 0, "slot_steps": 0, "useful_steps": 0, "admissions": 0}
        pending = list(range(len(prompts)))[::-1]
        free = list(range(slots))
        holder: dict[int, int] = {}
        while True:
            if free and pending and (len(free) == slots or (refill and len(free) >= min(admit_min, len(pending)))):
                take = [(free.pop(), pending.pop()) for _ in range(min(len(free), len(pending)))]
                ids, mask = self.encode_prompts([prompts[j] for _, j in take])
                run.admit([s for s, _ in take], ids, mask, [seeds[j] for _, j in take])
                holder.update(take)
                self.stream_stats["admissions"] += 1
            if not holder:
                return
            run.steps(self.check_every)
            self.stream_stats["decode_steps"] += self.check_every
            self.stream_stats["slot_steps"] += self.check_every * slots
            live = run.live_slots()
            finished = [s for s in holder if s not in live]
            for s, row in zip(finished, run.harvest(finished)):
                row.job = holder.pop(s)
                free.append(s)
                self.stream_stats["useful_steps"] += row.step_ids.shape[0]
                yield row

