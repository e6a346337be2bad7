"""One decoding call's device state: ``slots`` rows, each at its own step, advanced together by
one forward per step. Every tensor is allocated once and updated in place, so that on CUDA the
step can be captured in a graph and replayed on fixed addresses (docs/engine.md)."""

from __future__ import annotations

import warnings

import torch

from softtokens.engine.base import CotEngineBase
from softtokens.engine.decode_forward import DecodeForward
from softtokens.engine.kvcache import SlotKVCache, prefill_mask
from softtokens.engine.rollout import DONE, Rollout, RowResult
from softtokens.engine.row_states import RowStates
from softtokens.engine.sampling import entropy_from_logits
from softtokens.engine.settings import (
    CONTINUOUS_MODES,
    EMBEDDING,
    CotSetting,
    Placement,
)
from softtokens.engine.step_inputs import StepInputs
from softtokens.engine.step_record import StepRecord
from softtokens.model.head import Float32Head, decoder_hidden

# The attention of a fixed-shape decode step (the CUDA-graph path) reads the cache up to a window of
# columns: the smallest bucket (a multiple of WINDOW_BUCKET) that holds every live row through the steps
# a host look covers, not every preallocated column (which read ~25 % of the bandwidth at the start of
# a CoT on an H100; docs/gpu.md). One graph is captured per bucket.
WINDOW_BUCKET = 256


def window_buckets(max_len: int, bucket: int = WINDOW_BUCKET) -> list[int]:
    """The read windows of a cache of ``max_len`` columns: every multiple of ``bucket`` below it, and it."""
    return [w for w in range(bucket, max_len, bucket)] + [max_len]


class DecodeRun:
    """Admit prompts into free slots, step every slot, harvest finished rows. ``engine`` is a
    CotEngine (cot.py): its tokenizer facts and how it runs a step (attention, fixed shapes,
    CUDA graphs)."""

    def __init__(self, engine: CotEngineBase, setting: CotSetting, sigma: float, cot_max: int, answer_max: int,
                 answer_temperature: float, slots: int, max_prompt: int, record_inputs: bool,
                 placement: Placement = EMBEDDING, shared: list[int] = ()):
        model = engine.model
        self.engine, self.model, self.setting, self.sigma = engine, model, setting, sigma
        self.cot_max, self.answer_max = cot_max, answer_max
        dev = self.dev = model.device
        emb = model.get_input_embeddings()
        self.compute_dtype = emb.weight.dtype
        self.dim = dim = emb.weight.shape[1]
        vocab = engine.vocab_rows
        # logits, the mixture p @ E and the Gaussian noise are float32 (docs/engine.md, "Precision"):
        # on CUDA one bf16 GEMM with a float32 result, elsewhere float32 copies of W and E per call
        self.continuous = setting.mode in CONTINUOUS_MODES
        self.head = Float32Head(model, vocab, with_input=self.continuous)
        self.inputs = StepInputs(setting, sigma, answer_temperature, placement, self.head, dim)
        self.placement = self.inputs.placement
        self.max_steps = S = cot_max + engine.max_prefill + answer_max
        self.cache = self._cache(slots, max_prompt + S + 1, shared)
        # one position of the decoder as plain tensor operations where the architecture allows
        self.forward = (DecodeForward(model, self.cache.max_len, engine.attention, engine.elementwise)
                        if engine.fast_forward else None)
        self.n = slots
        self.rows = torch.arange(slots, device=dev)
        self.state = RowStates(engine, slots, cot_max, answer_max, vocab, dev)
        self.record = StepRecord(slots, S, dim, engine.pad_id, self.head.dtype, record_inputs and self.continuous,
                                 self.placement.top_k, dev)
        self.logits = torch.zeros(slots, vocab, dtype=self.head.dtype, device=dev)
        self.u_cot = torch.zeros(slots, cot_max, device=dev)
        self.u_ans = torch.zeros(slots, answer_max, device=dev)
        self.row_keys = torch.zeros(slots, dtype=torch.long, device=dev)  # each row's seed: its counter-noise key
        # the final hidden state that produced the current logits (hidden placement)
        self.hidden = (torch.zeros(slots, dim, dtype=self.head.dtype, device=dev)
                       if self.inputs.needs_hidden else None)
        self._live_host = torch.zeros(slots, dtype=torch.bool)
        self._length_bound = [0] * slots  # host-side upper bound of each slot's cache length
        self._graphs: dict[int, object] = {}  # read window -> the decode step captured with it
        self.fixed_shapes = engine.fixed_shapes
        engine.graph_status = "not on CUDA" if dev.type != "cuda" else "CUDA graphs off"
        if self.fixed_shapes:
            self.buckets = window_buckets(self.cache.max_len, max(16, WINDOW_BUCKET // 16 * 16))
            self.cache.window = self.cache.max_len
            if dev.type == "cuda" and engine.cuda_graphs:
                self._graphs = capture_windows(self)

    def _cache(self, slots: int, columns: int, shared: list[int]) -> SlotKVCache:
        """The per-slot KV cache, with the prefix every prompt starts with prefilled once (kvcache.py)."""
        if self.engine.attention in ("sdpa", "flex"):  # the fused kernels want rows aligned to 16 bytes
            columns = -(-columns // 16) * 16
        cache = SlotKVCache(slots, columns, self.dev)
        if shared:
            ids = torch.tensor([list(shared)], dtype=torch.long, device=self.dev)
            cache.begin_shared()
            decoder_hidden(self.model, input_ids=ids, attention_mask=prefill_mask(torch.ones_like(ids), self.compute_dtype),
                           position_ids=torch.arange(len(shared), device=self.dev).unsqueeze(0), past_key_values=cache,
                           use_cache=True)
            cache.end_shared()
        return cache

    # ---------------------------------------------------------------- admission
    def admit(self, slots: list[int], prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: list[int]) -> None:
        """Prefill new prompts (left-padded batch) into free slots and reset their state."""
        dev = self.dev
        if prompt_ids.shape[1] + self.max_steps >= self.cache.max_len:
            raise ValueError(f"prompt batch of width {prompt_ids.shape[1]} does not fit a cache sized for "
                             f"{self.cache.max_len - self.max_steps - 1} prompt tokens")
        idx = torch.tensor(slots, dtype=torch.long, device=dev)
        real = prompt_mask.sum(1)
        # a prompt repeated in the batch (G samples of a prompt in training, n samples of a problem
        # in evaluation) is run once: its first slot is prefilled, the others copy its cache columns
        # the host's one look at the batch (ids and lengths together; a traced run, gpucheck.trace, passes host
        # tensors, whose values its fake device tensors do not hold)
        first, inverse = first_occurrences(prompt_ids.tolist())
        lengths = [int(sum(m)) for m in prompt_mask.tolist()]
        src = torch.tensor(first, dtype=torch.long, device=dev)
        u_ids, u_mask = prompt_ids[src], prompt_mask[src]
        P = self.cache.shared
        if P:
            # what follows the shared prefix, left-padded to width - P: row i's prompt is its last
            # real - P tokens (the prefix's own tokens, held once in the cache, are masked out)
            u_mask = u_mask[:, : u_mask.shape[1] - P]
            u_ids = torch.where(u_mask.bool(), u_ids[:, P:], self.engine.pad_id)
        self.cache.begin_prefill(idx[src], prompt_ids.shape[1] - real[src])
        pos = P + (u_mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = decoder_hidden(self.model, input_ids=u_ids,
                                attention_mask=prefill_mask(u_mask, self.compute_dtype, shared=P),
                                position_ids=pos, past_key_values=self.cache, use_cache=True)[:, -1]
        self.cache.end_prefill(real[src])
        if len(first) < len(slots):
            inv = torch.tensor(inverse, dtype=torch.long, device=dev)
            self.cache.copy_slots(idx, idx[src][inv], prompt_ids.shape[1])
            hidden = hidden[inv]
        # the head over every slot's row, not once per distinct prompt: on the CPU a GEMM of one or
        # two rows rounds differently from a wider one (MKL's small-matrix path; up to 3e-6 in the
        # entropies), and the toy's evaluations are pinned to the head over the admitted batch
        self.logits[idx] = self.head.logits(hidden)
        if self.hidden is not None:
            self.hidden[idx] = hidden.to(self.hidden.dtype)
        u_cot, u_ans = self.engine.row_randomness(seeds, self.cot_max, self.answer_max)
        self.u_cot[idx], self.u_ans[idx] = u_cot, u_ans
        self.row_keys[idx] = torch.tensor([int(s) for s in seeds], dtype=torch.long, device=dev)
        self.state.start(idx)
        self.record.clear(idx)
        for s, r in zip(slots, lengths):
            self._length_bound[s] = r
        self._live_host[slots] = True

    # ---------------------------------------------------------------- decoding
    def live_slots(self) -> set[int]:
        return set(torch.nonzero(self._live_host).flatten().tolist())

    def steps(self, count: int) -> None:
        """``count`` decode steps, then one host look at which rows are still running. The attention
        reads the columns some row can reach by the last of them: exactly that eagerly, the smallest
        bucket that holds it with fixed shapes (the bucket's captured graph on CUDA)."""
        if self.fixed_shapes:
            need = min(self.cache.max_len, max(self._length_bound) + count + 1)
            window = next(w for w in self.buckets if w >= need)
            graph = self._graphs.get(window)
            self.cache.window = window
            for _ in range(count):
                graph.replay() if graph is not None else self._step()
            self._length_bound = [min(b + count, self.cache.max_len - 1) for b in self._length_bound]
        else:
            for _ in range(count):
                self.cache.window = min(self.cache.max_len, max(self._length_bound) + 1)
                self._step()
                self._length_bound = [min(b + 1, self.cache.max_len - 1) for b in self._length_bound]
        self._live_host = (self.state.phase != DONE).cpu()

    def _step(self) -> None:
        """One decode step for every slot, the paper's loop: choose what each row is fed from its
        current logits, record it, advance each row's state machine, run the model one position.
        Device work only."""
        state, rows = self.state, self.rows
        live, is_cot, is_pre, is_ans = state.masks()
        cot_idx, argmax = state.cot_index(), self.logits.argmax(-1)
        tok, mix, topk_ids = self.inputs.choose(
            self.logits, argmax, is_cot, is_ans, state.queued_token(is_pre), self.u_cot[rows, cot_idx],
            self.u_ans[rows, state.answer_index()], self.row_keys, cot_idx, self.hidden)
        self.record.write(rows, live, state.step_count, is_cot, state.phase, tok, argmax,
                          entropy_from_logits(self.logits), mix, topk_ids)
        state.advance(tok)
        x = self.model.get_input_embeddings()(tok)
        if mix is not None:
            x = torch.where(is_cot.unsqueeze(-1), mix.to(x.dtype), x)
        self._forward(x, live)

    def _forward(self, x: torch.Tensor, live: torch.Tensor) -> None:
        """The model one position on: the next logits (and hidden state), one cache column per live row."""
        cache = self.cache
        if self.forward is not None:
            hidden = self.forward(x, cache.lengths, cache)
        else:
            hidden = decoder_hidden(self.model, inputs_embeds=x.unsqueeze(1), attention_mask=cache.decode_mask(x.dtype),
                                    position_ids=cache.lengths.unsqueeze(1), past_key_values=cache, use_cache=True)[:, -1]
        self.logits.copy_(self.head.logits(hidden))
        if self.hidden is not None:
            self.hidden.copy_(hidden.to(self.hidden.dtype))
        cache.lengths += live

    # ---------------------------------------------------------------- results
    def harvest(self, slots: list[int]) -> list[RowResult]:
        if not slots:
            return []
        idx = torch.tensor(slots, dtype=torch.long, device=self.dev)
        return self.record.rows(self.engine.tokenizer, idx, self.state.step_count[idx].tolist(),
                                self.state.cot_pos[idx].tolist(), self.state.stopped[idx].tolist())

    def rollout(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> Rollout:
        return self.record.rollout(self.engine.tokenizer, int(self.state.step_count.max()), setting=self.setting,
                                   sigma=self.sigma, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                                   cot_len=self.state.cot_pos.cpu(), stopped=self.state.stopped.cpu(),
                                   placement=self.placement, row_keys=self.row_keys.clone())


def capture_windows(run: "DecodeRun") -> dict[int, object]:
    """One decode step of ``run`` captured in a CUDA graph per read window (its buckets), before any row
    is admitted: the warm-up and capture steps then only touch what admission overwrites (logits, the
    cache column at length 0, the discard column). The graphs share one memory pool (they are replayed
    one at a time). A step that cannot be captured runs eagerly, with a warning."""
    graphs: dict[int, object] = {}
    try:
        pool = None
        for window in run.buckets:
            run.cache.window = window
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    run._step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                run._step()
            pool = graph.pool()
            graphs[window] = graph
        run.engine.graph_status = "captured"
        return graphs
    except Exception as err:  # a model whose forward syncs with the host cannot be captured
        run.engine.graph_status = f"not captured ({type(err).__name__}: {err}); ran eagerly"
        warnings.warn(f"decode step not captured in a CUDA graph ({type(err).__name__}: {err}); running eagerly")
        return {}
    finally:
        run.cache.window = run.cache.max_len


def first_occurrences(rows: list[list[int]]) -> tuple[list[int], list[int]]:
    """(index of each distinct row's first occurrence, in order; each row's position in that list)."""
    seen: dict[tuple[int, ...], int] = {}
    first, inverse = [], []
    for i, row in enumerate(rows):
        key = tuple(row)
        if key not in seen:
            seen[key] = len(first)
            first.append(i)
        inverse.append(seen[key])
    return first, inverse
