"""Multiple-choice log-likelihood scoring: the batched, left-padded scorer against a direct
one-sequence-at-a-time reference, and the accuracy / NLL definitions."""

import json

import pytest
import torch

from softtokens.data.prompt import PROMPT_PREAMBLE
from softtokens.data.toy import toy_choice_rows
from softtokens.eval.loglik import continuation_requests, score_rows, summarise


def reference_loglik(model, tokenizer, context, choice):
    """Direct: the whole text, one sequence, no padding; continuation = tokens from the one
    that reaches past the separating space (character offsets)."""
    enc = tokenizer(context + " " + choice, return_offsets_mapping=True)
    whole, offsets, ctx = enc["input_ids"], enc["offset_mapping"], tokenizer(context)["input_ids"]
    if whole[: len(ctx)] == ctx:
        start = len(ctx)
    else:
        start = min(k for k, (_, end) in enumerate(offsets) if end > len(context) + 1)
    ids = torch.tensor([whole])
    logp = torch.log_softmax(model(input_ids=ids).logits.float()[0], -1)
    return sum(logp[t - 1, whole[t]].item() for t in range(start, len(whole))), len(whole) - start


def test_batched_scores_equal_the_unpadded_reference(tiny_model, toy_tokenizer):
    rows = toy_choice_rows(6, seed=3)
    rows.append({"id": "long", "context": "Question: " + "Ada has 12 apples. " * 5 + "\nAnswer:",
                 "choices": ["1", "12 apples and 13 more"], "label": 1})
    scored = score_rows(tiny_model, toy_tokenizer, rows, batch_size=5)  # mixed lengths in one batch
    for row, s in zip(rows, scored):
        for ci, choice in enumerate(row["choices"]):
            ll, n = reference_loglik(tiny_model, toy_tokenizer, row["context"], choice)
            assert s["loglik"][ci] == pytest.approx(ll, abs=1e-4)
            assert s["n_tokens"][ci] == n
        assert s["nll_correct"] == pytest.approx(-s["loglik"][row["label"]] / s["n_tokens"][row["label"]], rel=1e-4)
        assert s["pred"] == max(range(len(row["choices"])), key=lambda i: s["loglik"][i])


def test_continuation_is_the_tokens_past_the_context(toy_tokenizer):
    row = {"id": "r", "context": "Question: Ada has 12 apples.\nAnswer:", "choices": ["42", "7"], "label": 0}
    reqs = continuation_requests(toy_tokenizer, [row])
    ctx = toy_tokenizer(row["context"])["input_ids"]
    for (_, ci, whole, n_cont) in reqs:
        assert whole[: len(ctx)] == ctx
        assert toy_tokenizer.decode(whole[-n_cont:]).strip() == row["choices"][ci]


def test_a_token_merged_across_the_boundary_stays_whole(toy_rows):
    """With ' = ' one token (as the demo's toy BPE learns), 'x =' + ' 12' is '... = ', '1', '2':
    the context's own tokens ('... ', '=') are not a prefix, the continuation is the digits."""
    from softtokens.model.toy import train_toy_tokenizer

    tok = train_toy_tokenizer([r["cot"] for r in toy_rows["train"]], 200, whole_phrases=(" = ",))
    merged = {"id": "m", "context": "58 + 74: 8 + 4 =", "choices": ["12", "13"], "label": 0}
    assert tok(merged["context"])["input_ids"] != tok(merged["context"] + " 12")["input_ids"][:-2]
    for (_, ci, whole, n_cont) in continuation_requests(tok, [merged]):
        assert whole == tok(merged["context"] + " " + merged["choices"][ci])["input_ids"]
        assert tok.decode(whole[-n_cont:]) == merged["choices"][ci] and n_cont == 2


def test_summary_definitions():
    scored = [{"pred": 0, "pred_norm": 1, "label": 0, "nll_correct": 1.0},
              {"pred": 2, "pred_norm": 2, "label": 2, "nll_correct": 3.0},
              {"pred": 1, "pred_norm": 0, "label": 0, "nll_correct": 5.0},
              {"pred": 3, "pred_norm": 3, "label": 1, "nll_correct": 7.0}]
    assert summarise(scored) == {"n_problems": 4, "accuracy": 0.5, "accuracy_norm": 0.5, "nll_correct": 4.0}


def test_toy_choice_rows_are_well_formed_and_seeded():
    """A toy word problem and four worked solutions after "a + b:": the right one (its column sums with their carries
    and the true total) and wrong ones (the carries dropped, or the total 10 or 1 off), each ending in its total."""
    from softtokens.data.toy import toy_sum, worked_solution

    rows = toy_choice_rows(50, seed=1)
    assert rows == toy_choice_rows(50, seed=1)
    slips = 0
    for r in rows:
        assert len(r["choices"]) == 4 and len(set(r["choices"])) == 4
        a, b = (int(x) for x in r["context"].rsplit("Assistant: ", 1)[1].rstrip(":").split(" + "))
        assert r["context"].startswith(PROMPT_PREAMBLE) and r["context"].endswith(f"{a} + {b}:")
        assert r["choices"][r["label"]] == worked_solution(a, b) and r["choices"][r["label"]].endswith(f"Sum: {a + b}.")
        totals = [int(c.rsplit("Sum: ", 1)[1].rstrip(".")) for c in r["choices"]]
        assert totals.count(a + b) == 1 and r["question"] in r["context"]
        slips += worked_solution(a, b, forget_carry=True) in r["choices"] and toy_sum(a, b, True) != a + b
    assert len({r["label"] for r in rows}) == 4  # the gold position is shuffled
    assert 10 <= slips < 50   # the carry slip is a distractor wherever a carry happens


def test_cli_evaluate_loglik(tmp_path, tiny_model, toy_tokenizer):
    model_dir = tmp_path / "model"
    tiny_model.save_pretrained(model_dir)
    toy_tokenizer.save_pretrained(model_dir)
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in toy_choice_rows(8, seed=0)))
    out = tmp_path / "loglik.json"
    from softtokens.cli import main

    assert main(["evaluate-loglik", "--model", str(model_dir), "--data", str(data), "--out", str(out), "--settings",
                 json.dumps({"protocol": "generative", "batch_size": 4, "loglik_batch_size": 4, "cot_max_tokens": 6,
                             "answer_max_tokens": 3, "dtype": "float32"})]) == 0
    result = json.loads(out.read_text())
    assert result["n_problems"] == 8 and 0 <= result["accuracy"] <= 1 and result["nll_correct"] > 0
    assert result["protocol"] == "generative" and result["definition"]["accuracy"].startswith("success rate")
    assert result["provenance"]["external_inputs"]["data"]["sha256"] and result["provenance"]["config"]["protocol"] == "generative"
    assert result["provenance"]["config"]["cot_max_tokens"] == 6
