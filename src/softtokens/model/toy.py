"""Load a causal LM and its tokenizer (hub id or local directory, the same code path), the
embedding scale that sets the soft-token noise, and the toy Llama built from scratch."""

from __future__ import annotations

import math
import random
import time

import torch
from tqdm import tqdm

from softtokens.data.prompt import PREFILL_AFTER_STOP, PROMPT_PREAMBLE, format_prompt
from softtokens.data.toy import toy_cot, toy_sum

# ---------------------------------------------------------------- toy model
SPECIAL_TOKENS = {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>"}


def train_toy_tokenizer(texts: list[str], vocab_size: int, whole_phrases: tuple[str, ...] = ()):
    """Byte-level BPE trained on the toy corpus, digits split one per token (arithmetic needs
    it) and merges allowed across spaces, wrapped as a left-padding PreTrainedTokenizerFast.

    ``whole_phrases`` become single tokens (the paper's constant prompt preamble): the text the
    model reads is unchanged, but a tiny model on 2 CPU cores need not attend over 120 tokens
    of boilerplate at every step."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(p, normalized=False, special=False) for p in whole_phrases])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=SPECIAL_TOKENS["pad"],
                                   eos_token=SPECIAL_TOKENS["eos"], bos_token=SPECIAL_TOKENS["bos"],
                                   padding_side="left")


def build_toy_model(vocab_size: int, hidden_size: int, num_layers: int, num_heads: int,
                    intermediate_size: int, pad_id: int, eos_id: int, bos_id: int, seed: int,
                    max_positions: int = 512):
    """A tiny Llama with tied embeddings (like Llama-3.2-3B), randomly initialised."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                      num_attention_heads=num_heads, num_key_value_heads=num_heads,
                      intermediate_size=intermediate_size, max_position_embeddings=max_positions,
                      tie_word_embeddings=True, pad_token_id=pad_id, eos_token_id=eos_id,
                      bos_token_id=bos_id)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def _segments(row: dict, forget_carry: bool = False) -> tuple[str, str, str, str]:
    """(prompt, CoT, prefill, answer) of one supervised example; a forgetful CoT ends with its
    own (wrong) sum, as a student who made the slip would write it."""
    if not forget_carry:
        return format_prompt(row["question"]), row["cot"], PREFILL_AFTER_STOP, row["answer"] + "}."
    a, b = row["operands"]
    return format_prompt(row["question"]), toy_cot(a, b, True), PREFILL_AFTER_STOP, f"{toy_sum(a, b, True)}}}."


def build_toy_tokenizer(rows: list[dict], vocab_size: int):
    """The toy BPE tokenizer, trained on (up to 2000) reference examples as the engine reads them."""
    return train_toy_tokenizer(["".join(_segments(r)) for r in rows[:2000]], vocab_size,
                               whole_phrases=(PROMPT_PREAMBLE,))


def build_toy_base(train_rows: list[dict], hidden_size: int, num_layers: int, num_heads: int,
                   intermediate_size: int, vocab_size: int, sft_steps: int, sft_batch_size: int,
                   sft_lr: float, seed: int, forget_carry_rate: float = 0.0, threads: int = 1, progress=None):
    """Returns (model, tokenizer, log) with the model supervised on the reference CoTs, a
    ``forget_carry_rate`` fraction of them replaced by the forgetful-carry slip; ``progress(row)`` is
    called with each log row (step, loss, seconds) as it is made."""
    torch.set_num_threads(threads)
    tok = build_toy_tokenizer(train_rows, vocab_size)
    model = build_toy_model(len(tok), hidden_size, num_layers, num_heads, intermediate_size,
                            tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, seed)

    # token ids and loss mask (prompt tokens carry no loss) per training row
    # (every segment in one call: the same ids as one call per segment, without 16,000 calls' Python on the demo's
    # critical path)
    slip = random.Random(seed + 1)
    segments = [_segments(r, forget_carry=slip.random() < forget_carry_rate) for r in train_rows]
    flat = tok([text for row in segments for text in row], add_special_tokens=False)["input_ids"]
    encoded = []
    for i in range(len(segments)):
        ids, labels = [], []
        for seg, in_loss in zip(flat[4 * i: 4 * i + 4], (False, True, True, True)):   # prompt, cot, prefill, answer
            ids += seg
            labels += seg if in_loss else [-100] * len(seg)
        ids.append(tok.eos_token_id)
        labels.append(tok.eos_token_id)
        encoded.append((ids, labels))

    opt = torch.optim.AdamW(model.parameters(), lr=sft_lr, weight_decay=0.0)
    warmup = max(1, sft_steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / sft_steps))))
    rng = random.Random(seed)
    model.train()
    log, start = [], time.time()
    for step in tqdm(range(sft_steps), desc="toy SFT", mininterval=5):
        batch = rng.sample(encoded, sft_batch_size)
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), tok.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (ids, lab) in enumerate(batch):  # right padding for teacher forcing
            input_ids[i, : len(ids)] = torch.tensor(ids)
            labels[i, : len(lab)] = torch.tensor(lab)
            mask[i, : len(ids)] = 1
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step == sft_steps - 1:
            log.append({"step": step, "loss": round(loss.item(), 4), "seconds": round(time.time() - start, 1),
                        "steps": sft_steps})
            if progress is not None:
                progress(log[-1])
    model.eval()
    return model, tok, log
