"""The CoT decoding engine: one loop for hard, soft and fuzzy chains of thought.

Each row runs a small state machine, all rows in lockstep, one forward per step:

    COT ──(shadow text ends with "The final answer is:")──► PREFILL " \\boxed{" ──► ANSWER ──► DONE
        └─(CoT limit reached)──► PREFILL "The final answer is: \\boxed{" ─┘

At a CoT step the next input is, with p = softmax(logits / tau) (tau = 0: argmax):
- hard: the embedding E[x] of x ~ p (the greedy shadow token is x itself);
- soft / fuzzy: h~ = p @ E + sigma * N(0, I) (Section 3), shadow token argmax(logits).
Soft and fuzzy differ only in tau (0.5 vs 0.0001); they are one code path. Answer tokens are
always hard (sampled at the answer temperature, 0 = greedy). Everything fed is recorded, so
the training pass replays exactly the inputs the rollout consumed and never re-samples noise.

Randomness is drawn per row from a generator seeded by that row's seed (a function of run
seed, step, prompt and sample), so a row's result does not depend on what it is batched with.

Stopping rule (Appendix C): the paper stops when the text 'ends with "The final answer is: "'.
BPE tokenizers attach a space to the following word (" \\boxed"), so that text is rarely ever
the end of a generated prefix; we stop when the text, trailing whitespace removed, ends with
"The final answer is:", which fires on the paper's condition and one token earlier when the
model writes "is:" without a lone space token. The prefill " \\boxed{" then yields exactly
"The final answer is: \\boxed{".
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch

from softtokens.config import COT_KEYS
from softtokens.counter_noise import counter_normal
from softtokens.data import PREFILL_AFTER_STOP, PREFILL_AT_LIMIT, PROMPT_HEAD, STOP_TEXT
from softtokens import decode_forward
from softtokens.decode_forward import DecodeForward
from softtokens.kvcache import SlotKVCache, prefill_mask
from softtokens.metrics import entropy_from_logits
from softtokens.modeling import Float32Head, check_plain_output_head, decoder_hidden
from softtokens.stoprule import StopAutomaton

COT, PREFILL, ANSWER, DONE = 0, 1, 2, 3
REFILL_GROUPS = 8  # stream admits finished slots in groups of batch_size / REFILL_GROUPS
# a shared prefix shorter than this is prefilled with each prompt: the split attention's extra
# operations cost more than the few columns they save (the toy's preamble is one token)
MIN_SHARED_TOKENS = 16
CONTINUOUS_MODES = ("soft", "fuzzy")


class CotSetting(NamedTuple):
    """How the CoT is decoded."""

    mode: str            # "hard" | "soft" | "fuzzy"
    temperature: float   # CoT softmax temperature; 0 = argmax (hard greedy)
    noise_factor: float  # gamma; sigma = gamma * embedding RMS; 0 = no noise


class Placement(NamedTuple):
    """Where a soft / fuzzy CoT step's Gaussian noise goes (Appendix "Noise placement"; README,
    "Noise placements"). With p = softmax(z / tau) and the next input p @ E:
    - embedding (the paper's method): z = logits; input = p @ E + sigma N(0, I_d);
    - hidden: z = W (h + sigma N(0, I_d)), h the final hidden state before the output head; the
      input is the clean mixture of that noised distribution;
    - logits: z = logits + sigma N(0, I_V); with top_k > 0, z = the k largest logits plus
      sigma N(0, I_k), every other logit -inf (p is 0 outside the top k)."""

    where: str = "embedding"
    top_k: int = 0


EMBEDDING = Placement()
PLACEMENTS = ("embedding", "hidden", "logits")


def placement_of(keys: Mapping) -> Placement:
    """The Placement named by a config's noise_placement / noise_top_k (absent: the paper's)."""
    where = keys.get("noise_placement", "embedding")
    top_k = int(keys.get("noise_top_k", 0) or 0)
    if where not in PLACEMENTS:
        raise ValueError(f"noise_placement {where!r}: one of {', '.join(PLACEMENTS)}")
    if top_k and where != "logits":
        raise ValueError("noise_top_k needs noise_placement 'logits'")
    return Placement(where, top_k)


# the paper's values of the config keys that say how a CoT is decoded (config.COT_KEYS)
PAPER_COT = {"hard_temperature": 1.0, "soft_temperature": 0.5, "fuzzy_temperature": 0.0001, "noise_factor": 0.33}


def cot_settings(cot: Mapping) -> dict[str, CotSetting]:
    """The six inference settings (Section 4) from a config's CoT keys.

    Why one function: training rollouts decode with a mode's ``*_sample`` setting, greedy
    validation with its ``*_greedy`` one, and evaluation with all six. Derived here from the
    same keys, a change of ``soft_temperature`` (an ablation's τ) reaches test-time
    ``soft_greedy`` / ``soft_sample`` as it reaches training; it once did not."""
    missing = [k for k in COT_KEYS if k not in cot]
    if missing:
        raise KeyError(f"CoT settings need {', '.join(COT_KEYS)}; missing {', '.join(missing)}")
    gamma = float(cot["noise_factor"])
    soft, fuzzy = float(cot["soft_temperature"]), float(cot["fuzzy_temperature"])
    return {
        "hard_greedy": CotSetting("hard", 0.0, 0.0),
        "hard_sample": CotSetting("hard", float(cot["hard_temperature"]), 0.0),
        "soft_greedy": CotSetting("soft", soft, 0.0),
        "soft_sample": CotSetting("soft", soft, gamma),
        "fuzzy_greedy": CotSetting("fuzzy", fuzzy, 0.0),
        "fuzzy_sample": CotSetting("fuzzy", fuzzy, gamma),
    }


# The paper's defaults, the public view. Answers are always greedy at test time.
INFERENCE_SETTINGS: dict[str, CotSetting] = cot_settings(PAPER_COT)


def row_seed(*parts: int) -> int:
    """A stable 63-bit seed for one rollout row from (run seed, step, prompt, sample)."""
    digest = hashlib.sha256(",".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def ends_with_stop(text: str) -> bool:
    """The CoT stopping test (Appendix C), trailing whitespace ignored: see the module docstring."""
    return text.rstrip().endswith(STOP_TEXT)


def is_stochastic(setting: CotSetting) -> bool:
    if setting.mode in CONTINUOUS_MODES:
        return setting.noise_factor > 0
    return setting.temperature > 0


def probs_at_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / tau) in float32, safe for tau = 1e-4 (max-subtracted: no inf, no NaN);
    tau = 0 gives the one-hot of the argmax (the limit by continuity)."""
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(logits / temperature, dim=-1)


def sample_tokens(logits: torch.Tensor, temperature: float, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from softmax(logits / tau) with one given uniform per row (tau = 0: argmax)."""
    if temperature == 0:
        return logits.argmax(-1)
    cdf = probs_at_temperature(logits, temperature).cumsum(-1)
    idx = (cdf < uniforms.unsqueeze(-1) * cdf[..., -1:]).sum(-1)
    return idx.clamp(max=logits.shape[-1] - 1)


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
    row_keys: torch.Tensor | None = None    # (N,) each row's seed: the key of its counter noise (hidden, logits)
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


class CotEngine:
    """Decodes prompt -> CoT -> prefill -> answer for one model and tokenizer.

    The fast path (README, "Rollout engine"): a preallocated per-slot KV cache (kvcache.py), and
    a decode step with fixed shapes that runs the whole state machine on the device: phases,
    positions, the prefill queues, per-row randomness drawn at admission, and the stop rule as a
    token-level automaton (stoprule.py). The host looks at the rows every ``check_every`` steps
    (every step on a CPU, where a look costs nothing), to end the loop or refill finished slots;
    a finished row only writes to a discard column, so the check interval never changes results.
    On CUDA the step is captured once in a CUDA graph and replayed.
    ``reference_engine.ReferenceCotEngine`` is the plain loop it reproduces.

    ``shared_prefix``: text the prompts start with (default: the prompt template's instruction,
    data.PROMPT_HEAD). The tokens a call's prompts all share with it are prefilled once per call
    and read once per decode step for the whole batch (kvcache.py); None turns this off. It is
    fixed text, not whatever a batch's prompts happen to share, so that a row's arithmetic does
    not depend on the rows it is batched with."""

    def __init__(self, model, tokenizer, check_every: int | None = None, fixed_shapes: bool | None = None,
                 cuda_graphs: bool = True, shared_prefix: str | None = PROMPT_HEAD):
        check_plain_output_head(model)
        self.model = model
        self.tokenizer = tokenizer
        self.vocab_rows = len(tokenizer)  # rows of E beyond the tokenizer (Qwen pads E) are masked
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = {tokenizer.eos_token_id} | set(_as_list(getattr(model.generation_config, "eos_token_id", None)))
        self.eos_ids.discard(None)
        self.prefill_stop = tokenizer(PREFILL_AFTER_STOP, add_special_tokens=False)["input_ids"]
        self.prefill_limit = tokenizer(PREFILL_AT_LIMIT, add_special_tokens=False)["input_ids"]
        self.pieces = tokenizer.batch_decode([[i] for i in range(self.vocab_rows)])
        self.stop_rule = StopAutomaton(STOP_TEXT, self.pieces)
        on_cuda = model.device.type == "cuda"
        self.check_every = check_every or (8 if on_cuda else 1)
        # fixed shapes: the attention reads the whole preallocated cache (masked), as a captured
        # graph needs; elsewhere it reads only the columns some row has reached
        self.fixed_shapes = on_cuda if fixed_shapes is None else fixed_shapes
        self.cuda_graphs = cuda_graphs and on_cuda and self.fixed_shapes
        self.fast_forward = decode_forward.supports(model)
        self.cpu_kernels = True  # float32 on a CPU: the decode step's C kernels (native_decode.py) where they build
        # the decode step's attention: torch's fused kernel on CUDA, HF's eager arithmetic elsewhere
        self.attention = decode_forward.default_attention(model.device)
        # how the last decoding call ran: "captured" in a CUDA graph, or why not (gpu-check reports it)
        self.graph_status = "not run"
        self.shared_ids = tokenizer(shared_prefix)["input_ids"] if shared_prefix else []
        self.stream_stats: dict[str, int] = {}  # decode steps, slot-steps paid, slot-steps of live rows

    @property
    def embedding(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight[: self.vocab_rows]

    @property
    def max_prefill(self) -> int:
        return max(len(self.prefill_stop), len(self.prefill_limit))

    def shared_tokens(self, prompt_ids: list[list[int]]) -> list[int]:
        """The leading tokens of ``shared_ids`` that every prompt starts with, leaving each prompt at
        least one token of its own (the one whose logits start the CoT); none if fewer than
        MIN_SHARED_TOKENS. A prompt's last shared token may differ from the prefix's own
        tokenization (BPE merges it with the question's first word): the common part is used."""
        n = min([len(self.shared_ids)] + [len(ids) - 1 for ids in prompt_ids])
        for ids in prompt_ids:
            n = next((j for j in range(n) if ids[j] != self.shared_ids[j]), n)
        return self.shared_ids[:n] if n >= MIN_SHARED_TOKENS else []

    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        enc = self.tokenizer(prompts, padding=True, return_tensors="pt")
        dev = self.model.device
        return enc["input_ids"].to(dev), enc["attention_mask"].to(dev)

    def _row_randomness(self, seeds: list[int], cot_max: int, answer_max: int, dim: int, noise: bool):
        """Each row's uniforms (CoT, answer) and CoT noise, from a generator seeded by the row's seed."""
        dev = self.model.device
        u_cot, u_ans, eps = [], [], []
        for seed in seeds:
            g = torch.Generator(device=dev).manual_seed(int(seed))
            u_cot.append(torch.rand(cot_max, generator=g, device=dev))
            u_ans.append(torch.rand(answer_max, generator=g, device=dev))
            if noise:
                eps.append(torch.randn(cot_max, dim, generator=g, device=dev))
        return torch.stack(u_cot), torch.stack(u_ans), (torch.stack(eps) if noise else None)

    @torch.no_grad()
    def generate(self, prompts: list[str], setting: CotSetting, sigma: float, seeds: list[int],
                 cot_max_tokens: int, answer_max_tokens: int, answer_temperature: float = 0.0,
                 placement: Placement = EMBEDDING) -> Rollout:
        """All rows at once, until the last one ends (training rollouts, whose B x G rows start
        together); the Rollout records every input fed, for the update pass."""
        prompt_ids, prompt_mask = self.encode_prompts(prompts)
        shared = self.shared_tokens([row[m.bool()].tolist() for row, m in zip(prompt_ids.cpu(), prompt_mask.cpu())])
        run = _DecodeRun(self, setting, sigma, cot_max_tokens, answer_max_tokens, answer_temperature,
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
        saves (README, "Rollout engine"). A row's result does not depend on which rows share its
        batch, nor on when it was admitted."""
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt")
        if not prompts:
            return
        tokenized = self.tokenizer(prompts)["input_ids"]
        slots = min(batch_size, len(prompts))
        admit_min = max(1, slots // REFILL_GROUPS if admit_min is None else admit_min)
        run = _DecodeRun(self, setting, sigma, cot_max_tokens, answer_max_tokens, answer_temperature,
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


class _DecodeRun:
    """The device state of one decoding call: ``slots`` rows, each at its own step. Every tensor
    is allocated once and updated in place (a captured CUDA graph replays on fixed addresses)."""

    def __init__(self, engine: CotEngine, setting: CotSetting, sigma: float, cot_max: int, answer_max: int,
                 answer_temperature: float, slots: int, max_prompt: int, record_inputs: bool,
                 placement: Placement = EMBEDDING, shared: list[int] = ()):
        model = engine.model
        self.engine, self.model, self.setting, self.sigma = engine, model, setting, sigma
        self.cot_max, self.answer_max, self.answer_temperature = cot_max, answer_max, answer_temperature
        self.continuous = setting.mode in CONTINUOUS_MODES
        self.placement = placement if self.continuous else EMBEDDING
        self.noisy = self.continuous and sigma > 0
        # embedding noise is drawn per row at admission; the other placements' is counter noise
        self.noisy_embedding = self.noisy and self.placement.where == "embedding"
        dev = self.dev = model.device
        emb = model.get_input_embeddings()
        self.compute_dtype = emb.weight.dtype
        # logits, the mixture p @ E and the Gaussian noise are float32 (README, "Precision"): on CUDA
        # one bf16 GEMM with a float32 result, elsewhere float32 copies of W and E made once per call
        self.head = Float32Head(model, engine.vocab_rows, with_input=self.continuous)
        self.dim = dim = emb.weight.shape[1]
        vocab = engine.vocab_rows
        self.max_steps = S = cot_max + engine.max_prefill + answer_max
        columns = max_prompt + S + 1
        if engine.attention == "sdpa":  # the fused kernel wants its mask rows aligned to 16 bytes
            columns = -(-columns // 16) * 16
        self.cache = SlotKVCache(slots, columns, dev)
        if shared:  # the prefix every prompt starts with, once (kvcache.py)
            ids = torch.tensor([list(shared)], dtype=torch.long, device=dev)
            self.cache.begin_shared()
            decoder_hidden(model, input_ids=ids, attention_mask=prefill_mask(torch.ones_like(ids), self.compute_dtype),
                           position_ids=torch.arange(len(shared), device=dev).unsqueeze(0), past_key_values=self.cache,
                           use_cache=True)
            self.cache.end_shared()
        # one position of the decoder as plain tensor operations where the architecture allows
        self.forward = (DecodeForward(model, self.cache.max_len, engine.cpu_kernels, engine.attention)
                        if engine.fast_forward else None)
        self.fixed_shapes = engine.fixed_shapes
        self.n = slots
        self.rows = torch.arange(slots, device=dev)
        long = dict(dtype=torch.long, device=dev)
        self.phase = torch.full((slots,), DONE, **long)
        self.cot_pos, self.ans_pos, self.queue_pos, self.queue_kind, self.stop_state, self.step_count = (
            torch.zeros(slots, **long) for _ in range(6))
        self.stopped = torch.zeros(slots, dtype=torch.bool, device=dev)
        self.logits = torch.zeros(slots, vocab, dtype=self.head.dtype, device=dev)
        self.u_cot = torch.zeros(slots, cot_max, device=dev)
        self.u_ans = torch.zeros(slots, answer_max, device=dev)
        self.eps = torch.zeros(slots, cot_max, dim, device=dev) if self.noisy_embedding else None
        self.row_keys = torch.zeros(slots, **long)  # each row's seed: its counter-noise key
        # the final hidden state that produced the current logits (hidden placement)
        self.hidden = (torch.zeros(slots, dim, dtype=self.head.dtype, device=dev)
                       if self.noisy and self.placement.where == "hidden" else None)
        # per-step records; column S is where finished rows write (discarded)
        self.out_ids = torch.full((slots, S + 1), engine.pad_id, **long)
        self.out_phase = torch.full((slots, S + 1), DONE, dtype=torch.int8, device=dev)
        self.out_argmax = torch.full((slots, S + 1), engine.pad_id, **long)
        self.out_entropy = torch.zeros(slots, S + 1, device=dev)
        self.out_inputs = (torch.zeros(slots, S + 1, dim, dtype=self.head.dtype, device=dev)
                           if record_inputs and self.continuous else None)
        k = self.placement.top_k
        self.out_topk = torch.zeros(slots, S + 1, k, **long) if record_inputs and k else None
        # constants of the state machine
        queues = [engine.prefill_stop, engine.prefill_limit]
        width = max(map(len, queues))
        self.queues = torch.tensor([q + [engine.pad_id] * (width - len(q)) for q in queues], **long)
        self.queue_len = torch.tensor([len(q) for q in queues], **long)
        self.stop_table = engine.stop_rule.table.to(dev)
        self.accepting = engine.stop_rule.accepting.to(dev)
        self.is_eos = torch.zeros(vocab, dtype=torch.bool, device=dev)
        self.is_eos[[t for t in engine.eos_ids if t < vocab]] = True
        self._live_host = torch.zeros(slots, dtype=torch.bool)
        self._length_bound = [0] * slots  # host-side upper bound of each slot's cache length
        self._graph = None
        engine.graph_status = "not on CUDA" if dev.type != "cuda" else "CUDA graphs off"
        if self.fixed_shapes:
            self.cache.window = self.cache.max_len
            if dev.type == "cuda" and engine.cuda_graphs:
                self._graph = self._capture()

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
        first, inverse = _first_occurrences(prompt_ids.tolist())
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
        u_cot, u_ans, eps = self.engine._row_randomness(seeds, self.cot_max, self.answer_max, self.dim,
                                                        self.noisy_embedding)
        self.u_cot[idx], self.u_ans[idx] = u_cot, u_ans
        self.row_keys[idx] = torch.tensor([int(s) for s in seeds], dtype=torch.long, device=dev)
        if self.noisy_embedding:
            self.eps[idx] = eps
        self.phase[idx] = COT
        for t in (self.cot_pos, self.ans_pos, self.queue_pos, self.queue_kind, self.stop_state, self.step_count):
            t[idx] = 0
        self.stopped[idx] = False
        self.out_ids[idx] = self.engine.pad_id
        self.out_phase[idx] = DONE
        self.out_argmax[idx] = self.engine.pad_id
        self.out_entropy[idx] = 0.0
        if self.out_inputs is not None:
            self.out_inputs[idx] = 0.0
        if self.out_topk is not None:
            self.out_topk[idx] = 0
        for s, r in zip(slots, real.tolist()):
            self._length_bound[s] = r
        self._live_host[slots] = True

    # ---------------------------------------------------------------- decoding
    def live_slots(self) -> set[int]:
        return set(torch.nonzero(self._live_host).flatten().tolist())

    def steps(self, count: int) -> None:
        """``count`` decode steps, then one host look at which rows are still running."""
        for _ in range(count):
            if self.fixed_shapes:
                self._replay()
            else:
                bound = min(self.cache.max_len, max(self._length_bound) + 1)
                self.cache.window = bound
                self._step()
                self._length_bound = [min(b + 1, self.cache.max_len - 1) for b in self._length_bound]
        self._live_host = (self.phase != DONE).cpu()

    def _replay(self) -> None:
        if self._graph is None:
            self._step()
        else:
            self._graph.replay()

    def _capture(self):
        """One decode step captured in a CUDA graph, before any row is admitted: the warm-up and
        capture steps then only touch what admission overwrites (logits, the cache column at
        length 0, the discard column). A step that cannot be captured runs eagerly, with a warning."""
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._step()
            self.engine.graph_status = "captured"
            return graph
        except Exception as err:  # a model whose forward syncs with the host cannot be captured
            self.engine.graph_status = f"not captured ({type(err).__name__}: {err}); ran eagerly"
            warnings.warn(f"decode step not captured in a CUDA graph ({type(err).__name__}: {err}); running eagerly")
            return None

    def _step(self) -> None:
        """One decode step for every slot: choose the fed input from the current logits, record it,
        advance each row's state machine, run the model one position. Device work only."""
        eng, rows, S = self.engine, self.rows, self.max_steps
        phase, logits = self.phase, self.logits
        live = phase != DONE
        is_cot, is_pre, is_ans = phase == COT, phase == PREFILL, phase == ANSWER
        argmax = logits.argmax(-1)
        tok = torch.where(is_pre, self.queues[self.queue_kind, self.queue_pos.clamp(max=self.queues.shape[1] - 1)],
                          eng.pad_id)
        u_ans = self.u_ans[rows, self.ans_pos.clamp(max=self.answer_max - 1)]
        cot_idx = self.cot_pos.clamp(max=self.cot_max - 1)
        if not self.continuous and self.setting.temperature == self.answer_temperature:
            # hard CoT and answer tokens from the same distribution: one draw, each row with its own uniform
            drawn = argmax if self.answer_temperature == 0 else sample_tokens(
                logits, self.answer_temperature, torch.where(is_cot, self.u_cot[rows, cot_idx], u_ans))
            tok = torch.where(is_cot | is_ans, drawn, tok)
        else:
            tok = torch.where(is_ans, argmax if self.answer_temperature == 0
                              else sample_tokens(logits, self.answer_temperature, u_ans), tok)
        topk_ids = None
        if self.continuous and self.placement.where == "embedding":
            mix = self.head.mixture(probs_at_temperature(logits, self.setting.temperature))
            if self.noisy:
                mix = mix + self.sigma * self.eps[rows, cot_idx]
            tok = torch.where(is_cot, argmax, tok)
        elif self.continuous:
            noised, topk_ids = self._noised_logits(logits, cot_idx)
            mix = self.head.mixture(probs_at_temperature(noised, self.setting.temperature))
            tok = torch.where(is_cot, noised.argmax(-1), tok)  # the shadow token: the noised distribution's mode
        elif self.setting.temperature != self.answer_temperature:
            tok = torch.where(is_cot, argmax if self.setting.temperature == 0
                              else sample_tokens(logits, self.setting.temperature, self.u_cot[rows, cot_idx]), tok)
        x = self.model.get_input_embeddings()(tok)
        if self.continuous:
            x = torch.where(is_cot.unsqueeze(-1), mix.to(x.dtype), x)

        # record at each row's step column (finished rows: the discard column S), flat index_copy_
        flat = rows * (S + 1) + torch.where(live, self.step_count, S)
        self.out_ids.view(-1).index_copy_(0, flat, tok)
        self.out_phase.view(-1).index_copy_(0, flat, phase.to(torch.int8))
        self.out_argmax.view(-1).index_copy_(0, flat, argmax)
        self.out_entropy.view(-1).index_copy_(0, flat, torch.where(is_cot, entropy_from_logits(logits), 0.0))
        if self.out_inputs is not None:
            self.out_inputs.view(-1, self.dim).index_copy_(0, flat, torch.where(is_cot.unsqueeze(-1), mix, 0.0))
        if self.out_topk is not None:
            self.out_topk.view(-1, self.placement.top_k).index_copy_(0, flat, topk_ids)
        self.step_count += live

        # the state machine (module docstring), every row at once
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
        new_phase = torch.where(hit_stop | hit_limit, PREFILL, phase)
        new_phase = torch.where(ans_done, DONE, new_phase)
        exhausted = (new_phase == PREFILL) & (self.queue_pos >= self.queue_len[self.queue_kind])
        phase.copy_(torch.where(exhausted, ANSWER, new_phase))

        cache = self.cache
        if self.forward is not None:
            hidden = self.forward(x, cache.lengths, cache)
        else:
            hidden = decoder_hidden(self.model, inputs_embeds=x.unsqueeze(1), attention_mask=cache.decode_mask(x.dtype),
                                    position_ids=cache.lengths.unsqueeze(1), past_key_values=cache, use_cache=True)[:, -1]
        logits.copy_(self.head.logits(hidden))
        if self.hidden is not None:
            self.hidden.copy_(hidden.to(self.hidden.dtype))
        cache.lengths += live

    def _noised_logits(self, logits: torch.Tensor, cot_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The logits a hidden- or logits-placed CoT step mixes (Placement), and the top-k ids
        (top-k placement). The noise of row i at CoT step t is counter_normal(seed_i, t): the
        update pass draws it again instead of storing it."""
        where, k = self.placement
        if where == "hidden":
            if not self.noisy:  # W h is the current logits: no second projection
                return logits, None
            h = self.hidden + self.sigma * counter_normal(self.row_keys, cot_idx, self.dim)
            return self.head.logits(h), None
        if k:
            values, ids = logits.topk(k, dim=-1)
            if self.noisy:
                values = values + self.sigma * counter_normal(self.row_keys, cot_idx, k)
            return torch.full_like(logits, float("-inf")).scatter(-1, ids, values), ids
        if self.noisy:
            return logits + self.sigma * counter_normal(self.row_keys, cot_idx, logits.shape[-1]), None
        return logits, None

    # ---------------------------------------------------------------- results
    def harvest(self, slots: list[int]) -> list[RowResult]:
        if not slots:
            return []
        idx = torch.tensor(slots, dtype=torch.long, device=self.dev)
        steps = self.step_count[idx].tolist()
        width = max(steps)
        ids, phase = self.out_ids[idx, :width].cpu(), self.out_phase[idx, :width].cpu()
        entropy, argmax = self.out_entropy[idx, :width].cpu(), self.out_argmax[idx, :width].cpu()
        inputs = self.out_inputs[idx, :width].cpu() if self.out_inputs is not None else None
        cot_len, stopped = self.cot_pos[idx].tolist(), self.stopped[idx].tolist()
        texts = _texts(self.engine.tokenizer, ids.tolist(), phase.tolist())
        return [RowResult(-1, ids[i, :t], phase[i, :t], entropy[i, :t], argmax[i, :t],
                          None if inputs is None else inputs[i, :t], cot_len[i], stopped[i], *texts[i])
                for i, t in enumerate(steps)]

    def rollout(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> Rollout:
        used = int(self.step_count.max())
        texts = _texts(self.engine.tokenizer, self.out_ids[:, :used].tolist(), self.out_phase[:, :used].tolist())
        return Rollout(setting=self.setting, sigma=self.sigma, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                       step_ids=self.out_ids[:, :used].clone(), step_phase=self.out_phase[:, :used].clone(),
                       noisy_inputs=None if self.out_inputs is None else self.out_inputs[:, :used].clone(),
                       cot_entropy=self.out_entropy[:, :used].clone(), cot_len=self.cot_pos.cpu(),
                       stopped=self.stopped.cpu(), completions=[c for c, _ in texts], cot_texts=[t for _, t in texts],
                       argmax_ids=self.out_argmax[:, :used].clone(), placement=self.placement,
                       row_keys=self.row_keys.clone(),
                       topk_ids=None if self.out_topk is None else self.out_topk[:, :used].clone())


def _first_occurrences(rows: list[list[int]]) -> tuple[list[int], list[int]]:
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


def _texts(tokenizer, ids: list[list[int]], phases: list[list[int]]) -> list[tuple[str, str]]:
    """(completion, CoT text) per row: the completion is what followed the CoT (prefill + answer)."""
    out = []
    for row, phs in zip(ids, phases):
        cot = tokenizer.decode([t for t, p in zip(row, phs) if p == COT])
        completion = tokenizer.decode([t for t, p in zip(row, phs) if p in (PREFILL, ANSWER)], skip_special_tokens=True)
        out.append((completion, cot))
    return out


def _as_list(x) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple, set)) else [x]
