"""The reference CoT engine: the plain per-step loop the fast engine (cot.CotEngine) must
reproduce. One Hugging Face forward per step over a growing DynamicCache, the state machine and
the stop rule in Python on decoded text, a batch that runs until its longest row ends.

It is kept as the executable specification: tests compare the fast engine with it in every
setting (tokens, log-probabilities, recorded soft inputs), and benchmarks/rollout_speed.py
reports the fast engine's speed relative to it ("the previous engine").
"""

from __future__ import annotations

import torch

from softtokens.engine.base import CotEngineBase
from softtokens.engine.noise import counter_normal
from softtokens.engine.rollout import ANSWER, COT, DONE, PREFILL, Rollout, decode_texts
from softtokens.engine.sampling import (
    entropy_from_logits,
    probs_at_temperature,
    sample_tokens,
)
from softtokens.engine.settings import (
    CONTINUOUS_MODES,
    EMBEDDING,
    CotSetting,
    Placement,
)
from softtokens.engine.stoprule import ends_with_stop
from softtokens.model.head import decoder_hidden, float32_weights, output_logits


class ReferenceCotEngine(CotEngineBase):
    """The ``generate`` of CotEngine, with the same result (the trainer can run on either: benchmarks/rollout_speed.py times an RL step with each). It implements the paper's
    noise placement only (on the embedding); the others are the fast engine's alone."""

    @torch.no_grad()
    def generate(self, prompts: list[str], setting: CotSetting, sigma: float, seeds: list[int],
                 cot_max_tokens: int, answer_max_tokens: int, answer_temperature: float = 0.0,
                 placement: Placement = EMBEDDING) -> Rollout:
        from transformers import DynamicCache

        model, E = self.model, self.embedding
        dev, n, dim = model.device, len(prompts), E.shape[1]
        continuous = setting.mode in CONTINUOUS_MODES
        if continuous and placement != EMBEDDING:
            raise NotImplementedError(f"the reference loop puts the noise on the embedding only, not {placement}")
        # float32 views of the output projection and of E, made once per call (no copy in float32):
        # logits, the mixture p @ E and the Gaussian noise are float32 (docs/engine.md, "Precision")
        W32, E32 = float32_weights(model, self.vocab_rows, with_input=continuous)
        wide = W32.dtype
        noisy_cot = continuous and sigma > 0
        prompt_ids, prompt_mask = self.encode_prompts(prompts)
        max_steps = cot_max_tokens + self.max_prefill + answer_max_tokens
        u_cot, u_ans = self.row_randomness(seeds, cot_max_tokens, answer_max_tokens)
        keys = torch.tensor([int(s) for s in seeds], dtype=torch.long, device=dev)  # each row's noise key

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
                if noisy_cot:  # counter noise of (row seed, CoT step), as the fast engine draws it
                    mix = mix + sigma * counter_normal(keys, cot_idx, dim).to(wide)
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
                    tails[i] = tails[i] + self.pieces[t]
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
        texts = decode_texts(self.tokenizer, step_ids.tolist(), step_phase.tolist())
        completions, cot_texts = [c for c, _ in texts], [t for _, t in texts]
        return Rollout(setting=setting, sigma=sigma, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                       step_ids=step_ids, step_phase=step_phase, noisy_inputs=noisy_inputs,
                       cot_entropy=cot_entropy, cot_len=torch.tensor(cot_pos), stopped=torch.tensor(stopped),
                       completions=completions, cot_texts=cot_texts, argmax_ids=argmax_ids, row_keys=keys)
