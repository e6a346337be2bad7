"""Multiple-choice options scored by log-likelihood, the way lm-evaluation-harness scores them:
the NLL of the correct answer in the paper's out-of-domain table, and the ``cloze`` protocol's
accuracy (softtokens.ood has both protocols).

For a row ``{"context", "choices", "label"}`` each choice is the continuation ``" " + choice``
after ``context``; its score is the summed log-probability of the continuation's tokens, where
the continuation's tokens are those of ``tokenize(context + " " + choice)`` past the
``tokenize(context)`` prefix (lm-eval's split; the tokenizer adds its BOS as in generation); if
the tokenizer merges a token across that boundary, it stays whole and counts as context.

- ``accuracy``: share of rows whose highest-scoring choice is the gold one (ties: first index).
- ``accuracy_norm``: the same with each score divided by the choice's character length.
- ``nll_correct``: mean over rows of −(summed log-likelihood of the gold continuation) /
  (its number of tokens), in nats per token.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from softtokens.model.head import decoder_hidden, output_logits


def continuation_requests(tokenizer, rows: list[dict]) -> list[tuple[int, int, list[int], int]]:
    """(row index, choice index, token ids of context + continuation, continuation length).

    The text ``context + " " + choice`` is tokenized whole, as the model would see it. As in
    lm-eval, the continuation is its tokens past ``tokenize(context)`` when those are a prefix
    (Llama-3 and Qwen2.5 put the space in the choice's first token, or alone before a number).
    Where the tokenizer merges across the boundary instead (the toy BPE's ' = '), slicing by the
    context's token count would cut a token in two: the continuation then starts at the first
    token that reaches past the separating space, by character offsets."""
    requests = []
    contexts = tokenizer([r["context"] for r in rows])["input_ids"]
    for ri, (row, ctx_ids) in enumerate(zip(rows, contexts)):
        boundary = len(row["context"]) + 1  # the choice starts after the separating space
        enc = tokenizer([row["context"] + " " + c for c in row["choices"]], return_offsets_mapping=True)
        for ci, (whole, offsets) in enumerate(zip(enc["input_ids"], enc["offset_mapping"])):
            if whole[: len(ctx_ids)] == ctx_ids:
                start = len(ctx_ids)
            else:
                start = next((k for k, (_, end) in enumerate(offsets) if end > boundary), len(whole))
            n_cont = len(whole) - start
            if n_cont < 1:
                raise ValueError(f"row {row.get('id', ri)} choice {ci}: the continuation has no tokens of its own")
            requests.append((ri, ci, whole, n_cont))
    return requests


@torch.no_grad()
def continuation_log_likelihoods(model, pad_id: int, requests: list[tuple[int, int, list[int], int]],
                                 batch_size: int, desc: str = "loglik") -> list[float]:
    """Summed log-probability of each request's continuation given its context.

    Requests are batched longest first and left-padded, so every continuation ends at the last
    position and one ``logits_to_keep`` covers them all (the vocabulary projection is only
    computed where it is needed, in float32: model.head)."""
    dev = model.device
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i][2]))
    out = [0.0] * len(requests)
    for start in tqdm(range(0, len(order), batch_size), desc=desc, mininterval=5):
        chunk = [order[j] for j in range(start, min(len(order), start + batch_size))]
        inputs = [requests[i][2][:-1] for i in chunk]
        width = max(len(x) for x in inputs)
        keep = max(requests[i][3] for i in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for k, x in enumerate(inputs):
            ids[k, width - len(x):] = torch.tensor(x)
            mask[k, width - len(x):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        hidden = decoder_hidden(model, input_ids=ids, attention_mask=mask, position_ids=pos)
        logp = torch.log_softmax(output_logits(model, hidden[:, -keep:]), dim=-1)  # (b, keep, V), float32
        for k, i in enumerate(chunk):
            whole, n_cont = requests[i][2], requests[i][3]
            target = torch.tensor(whole[-n_cont:], device=dev)
            out[i] = logp[k, keep - n_cont:].gather(-1, target[:, None]).sum().item()
    return out


def score_rows(model, tokenizer, rows: list[dict], batch_size: int = 32, desc: str = "loglik") -> list[dict]:
    """Per row: the log-likelihood and token count of every choice, prediction and gold."""
    requests = continuation_requests(tokenizer, rows)
    ll = continuation_log_likelihoods(model, tokenizer.pad_token_id, requests, batch_size, desc)
    per_row = [{"loglik": [0.0] * len(r["choices"]), "n_tokens": [0] * len(r["choices"])} for r in rows]
    for (ri, ci, _, n_cont), value in zip(requests, ll):
        per_row[ri]["loglik"][ci] = value
        per_row[ri]["n_tokens"][ci] = n_cont
    scored = []
    for row, s in zip(rows, per_row):
        ll_row, label = s["loglik"], row["label"]
        normed = [v / max(1, len(c)) for v, c in zip(ll_row, row["choices"])]
        scored.append({"id": row["id"], "label": label,
                       "pred": max(range(len(ll_row)), key=lambda i: (ll_row[i], -i)),
                       "pred_norm": max(range(len(normed)), key=lambda i: (normed[i], -i)),
                       "nll_correct": -ll_row[label] / s["n_tokens"][label],
                       "loglik": [round(v, 5) for v in ll_row], "n_tokens": s["n_tokens"]})
    return scored


def summarise(scored: list[dict]) -> dict:
    n = len(scored)
    return {"n_problems": n,
            "accuracy": sum(s["pred"] == s["label"] for s in scored) / n,
            "accuracy_norm": sum(s["pred_norm"] == s["label"] for s in scored) / n,
            "nll_correct": sum(s["nll_correct"] for s in scored) / n}
