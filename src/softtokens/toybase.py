"""The toy base model: a tiny Llama and a BPE tokenizer trained from scratch, then briefly
supervised on reference CoTs in the paper's prompt format, so RL starts from a model that
sometimes succeeds. Sequences are tokenized segment by segment (prompt | CoT | prefill |
answer), exactly as the generation engine feeds them."""

from __future__ import annotations

import math
import random
import time

import torch
from tqdm import tqdm

from softtokens.data import PREFILL_AFTER_STOP, PROMPT_PREAMBLE, format_prompt, toy_cot, toy_sum
from softtokens.modeling import build_toy_model, train_toy_tokenizer


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
                   sft_lr: float, seed: int, forget_carry_rate: float = 0.0, threads: int = 1):
    """Returns (model, tokenizer, log) with the model supervised on the reference CoTs, a
    ``forget_carry_rate`` fraction of them replaced by the forgetful-carry slip."""
    torch.set_num_threads(threads)
    tok = build_toy_tokenizer(train_rows, vocab_size)
    model = build_toy_model(len(tok), hidden_size, num_layers, num_heads, intermediate_size,
                            tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, seed)

    # token ids and loss mask (prompt tokens carry no loss) per training row
    encoded = []
    slip = random.Random(seed + 1)
    for r in train_rows:
        prompt, cot, prefill, answer = _segments(r, forget_carry=slip.random() < forget_carry_rate)
        ids, labels = [], []
        for text, in_loss in ((prompt, False), (cot, True), (prefill, True), (answer, True)):
            seg = tok(text, add_special_tokens=False)["input_ids"]
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
            log.append({"step": step, "loss": round(loss.item(), 4), "seconds": round(time.time() - start, 1)})
    model.eval()
    return model, tok, log
