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
from dataclasses import dataclass
from typing import NamedTuple

import torch

from softtokens.data import PREFILL_AFTER_STOP, PREFILL_AT_LIMIT, STOP_TEXT
from softtokens.metrics import entropy_from_logits
from softtokens.modeling import check_plain_output_head, decoder_hidden, float32_weights, output_logits

COT, PREFILL, ANSWER, DONE = 0, 1, 2, 3
CONTINUOUS_MODES = ("soft", "fuzzy")


class CotSetting(NamedTuple):
    """How the CoT is decoded."""

    mode: str            # "hard" | "soft" | "fuzzy"
    temperature: float   # CoT softmax temperature; 0 = argmax (hard greedy)
    noise_factor: float  # gamma; sigma = gamma * embedding RMS; 0 = no noise


# Section 4, 'Inference settings'. Answers are always greedy at test time.
INFERENCE_SETTINGS: dict[str, CotSetting] = {
    "hard_greedy": CotSetting("hard", 0.0, 0.0),
    "hard_sample": CotSetting("hard", 1.0, 0.0),
    "soft_greedy": CotSetting("soft", 0.5, 0.0),
    "soft_sample": CotSetting("soft", 0.5, 0.33),
    "fuzzy_greedy": CotSetting("fuzzy", 0.0001, 0.0),
    "fuzzy_sample": CotSetting("fuzzy", 0.0001, 0.33),
}


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


    def rows(self, idx: slice | torch.Tensor) -> "Rollout":
        """A sub-batch (for micro-batched updates)."""
        pick = (lambda t: None if t is None else t[idx])
        sel = range(len(self.completions))[idx] if isinstance(idx, slice) else idx.tolist()
        return Rollout(self.setting, self.sigma, pick(self.prompt_ids), pick(self.prompt_mask),
                       pick(self.step_ids), pick(self.step_phase), pick(self.noisy_inputs),
                       pick(self.cot_entropy), pick(self.cot_len), pick(self.stopped),
                       [self.completions[i] for i in sel], [self.cot_texts[i] for i in sel], pick(self.argmax_ids))


class CotEngine:
    """Decodes prompt -> CoT -> prefill -> answer for one model and tokenizer."""

    def __init__(self, model, tokenizer):
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
        self._tail = len(STOP_TEXT) + 16

    @property
    def embedding(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight[: self.vocab_rows]

    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        enc = self.tokenizer(prompts, padding=True, return_tensors="pt")
        dev = self.model.device
        return enc["input_ids"].to(dev), enc["attention_mask"].to(dev)

    def _row_randomness(self, seeds: list[int], cot_max: int, answer_max: int, dim: int, noise: bool):
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
                 cot_max_tokens: int, answer_max_tokens: int, answer_temperature: float = 0.0) -> Rollout:
        from transformers import DynamicCache

        model, E = self.model, self.embedding
        dev, n, dim = model.device, len(prompts), E.shape[1]
        continuous = setting.mode in CONTINUOUS_MODES
        # float32 views of the output projection and of E, made once per call (no copy in float32):
        # logits, the mixture p @ E and the Gaussian noise are float32 (README, "Precision")
        W32, E32 = float32_weights(model, self.vocab_rows, with_input=continuous)
        wide = W32.dtype
        noisy_cot = continuous and sigma > 0
        prompt_ids, prompt_mask = self.encode_prompts(prompts)
        max_steps = cot_max_tokens + max(len(self.prefill_stop), len(self.prefill_limit)) + answer_max_tokens
        u_cot, u_ans, eps = self._row_randomness(seeds, cot_max_tokens, answer_max_tokens, dim, noisy_cot)

        p_len = prompt_ids.shape[1]
        mask = torch.ones(n, p_len + max_steps, dtype=prompt_mask.dtype, device=dev)
        mask[:, :p_len] = prompt_mask
        step_ids = torch.full((n, max_steps), self.pad_id, dtype=torch.long, device=dev)
        step_phase = torch.full((n, max_steps), DONE, dtype=torch.int8, device=dev)
        argmax_ids = torch.full((n, max_steps), self.pad_id, dtype=torch.long, device=dev)
        cot_entropy = torch.zeros(n, max_steps, device=dev)
        noisy_inputs = torch.zeros(n, max_steps, dim, dtype=wide, device=dev) if continuous else None

        cache = DynamicCache(config=model.config)
        pos = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = decoder_hidden(model, input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=pos,
                                past_key_values=cache, use_cache=True)
        logits = output_logits(model, hidden[:, -1], weight=W32)
        next_pos = pos[:, -1] + 1

        # host-side state machine
        phase = [COT] * n
        cot_pos, ans_pos, queue_pos = [0] * n, [0] * n, [0] * n
        queues: list[list[int]] = [[] for _ in range(n)]
        tails = [""] * n
        stopped = [False] * n
        rows = torch.arange(n, device=dev)
        forced = torch.full((n,), self.pad_id, dtype=torch.long, device=dev)
        used = 0
        for s in range(max_steps):
            phase_t = torch.tensor(phase, dtype=torch.int8, device=dev)
            is_cot = phase_t == COT
            any_cot, any_answer = COT in phase, ANSWER in phase  # skip work no row needs
            cot_idx = torch.tensor(cot_pos, device=dev).clamp(max=cot_max_tokens - 1) if any_cot else None
            tok = forced
            if any_answer:
                ans_idx = torch.tensor(ans_pos, device=dev).clamp(max=answer_max_tokens - 1)
                ans_tok = sample_tokens(logits, answer_temperature, u_ans[rows, ans_idx])
                tok = torch.where(phase_t == ANSWER, ans_tok, tok)
            argmax = logits.argmax(-1)
            if any_cot and continuous:
                mix = probs_at_temperature(logits, setting.temperature).to(wide) @ E32  # (N, d), float32
                if noisy_cot:
                    mix = mix + sigma * eps[rows, cot_idx]
                tok = torch.where(is_cot, argmax, tok)
            elif any_cot:
                tok = torch.where(is_cot, sample_tokens(logits, setting.temperature, u_cot[rows, cot_idx]), tok)
            x = model.get_input_embeddings()(tok)
            if any_cot and continuous:
                x = torch.where(is_cot.unsqueeze(-1), mix.to(x.dtype), x)
                noisy_inputs[:, s] = torch.where(is_cot.unsqueeze(-1), mix, 0)
            step_ids[:, s] = tok
            argmax_ids[:, s] = argmax
            step_phase[:, s] = phase_t
            if any_cot:
                cot_entropy[:, s] = torch.where(is_cot, entropy_from_logits(logits), 0.0)
            used = s + 1

            forced_next = [self.pad_id] * n
            for i, t in enumerate(tok.tolist()):
                ph = phase[i]
                if ph == COT:
                    cot_pos[i] += 1
                    tails[i] = (tails[i] + self.pieces[t])[-self._tail:]
                    if ends_with_stop(tails[i]):
                        stopped[i], phase[i], queues[i] = True, PREFILL, self.prefill_stop
                    elif cot_pos[i] >= cot_max_tokens:
                        phase[i], queues[i] = PREFILL, self.prefill_limit
                elif ph == PREFILL:
                    queue_pos[i] += 1
                elif ph == ANSWER:
                    ans_pos[i] += 1
                    if t in self.eos_ids or ans_pos[i] >= answer_max_tokens:
                        phase[i] = DONE
                if phase[i] == PREFILL:
                    if queue_pos[i] < len(queues[i]):
                        forced_next[i] = queues[i][queue_pos[i]]
                    else:
                        phase[i] = ANSWER
            if all(ph == DONE for ph in phase):
                break
            forced = torch.tensor(forced_next, dtype=torch.long, device=dev)
            hidden = decoder_hidden(model, inputs_embeds=x.unsqueeze(1), attention_mask=mask[:, : p_len + s + 1],
                                    position_ids=next_pos.unsqueeze(1), past_key_values=cache, use_cache=True)
            logits = output_logits(model, hidden[:, -1], weight=W32)
            next_pos = next_pos + 1

        step_ids, step_phase, argmax_ids = step_ids[:, :used], step_phase[:, :used], argmax_ids[:, :used]
        cot_entropy = cot_entropy[:, :used]
        if noisy_inputs is not None:
            noisy_inputs = noisy_inputs[:, :used]
        ids_host, phase_host = step_ids.tolist(), step_phase.tolist()
        completions, cot_texts = [], []
        for ids, phs in zip(ids_host, phase_host):
            cot_texts.append(self.tokenizer.decode([t for t, p in zip(ids, phs) if p == COT]))
            completions.append(self.tokenizer.decode(
                [t for t, p in zip(ids, phs) if p in (PREFILL, ANSWER)], skip_special_tokens=True))
        return Rollout(setting=setting, sigma=sigma, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                       step_ids=step_ids, step_phase=step_phase, noisy_inputs=noisy_inputs,
                       cot_entropy=cot_entropy, cot_len=torch.tensor(cot_pos), stopped=torch.tensor(stopped),
                       completions=completions, cot_texts=cot_texts, argmax_ids=argmax_ids)


def _as_list(x) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple, set)) else [x]
