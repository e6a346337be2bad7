"""The paper's out-of-domain protocol (generative: a hard greedy CoT and a boxed option) and the
cloze one: reading an answer, the question each benchmark's rows become, and that every recorded
prediction is what greedy decoding of its recorded prompt gives."""

import json
from pathlib import Path

import pytest

from softtokens.data.prompt import PROMPT_PREAMBLE
from softtokens.data.splits import prepare
from softtokens.data.toy import toy_choice_rows
from softtokens.engine.reference import ReferenceCotEngine
from softtokens.engine.settings import INFERENCE_SETTINGS
from softtokens.eval.ood import (
    INSTRUCTION,
    evaluate_ood,
    mc_question,
    prompt_hash,
    prompt_of,
    read_choice,
)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("completion,expected", [
    (" \\boxed{B}.", 1), (" \\boxed{(c)}", 2), (" \\boxed{C) stone}.", 2), (" \\boxed{D. wood", 3),
    (" \\boxed{\\text{A}}", 0), (" \\boxed{option B}", 1), (" \\boxed{Water}.", 1), (" \\boxed{ water }", 1),
    (" \\boxed{E}.", None), (" \\boxed{steam}", None), ("no box at all", None), (" \\boxed{}", None),
])
def test_read_choice(completion, expected):
    assert read_choice(completion, ["ice", "water", "stone", "wood"]) == expected


def _rows(name: str) -> list[dict]:
    split = {"hellaswag": "validation"}.get(name, "test")
    settings = {"loader": name, "path": str(FIXTURES / name / f"{split}.jsonl".replace(split, "{split}")), "seed": 0}
    return prepare(name, settings, ("test",))[0]["test"]


@pytest.mark.parametrize("name", ["hellaswag", "arc", "mmlu"])
def test_each_benchmark_becomes_a_lettered_question(name):
    """From each source's own row format: the question (HellaSwag: the passage to complete), the
    options lettered in order, the instruction, in the paper's task prompt."""
    for row in _rows(name):
        q = mc_question(row)
        assert q.endswith(INSTRUCTION)
        for i, choice in enumerate(row["choices"]):
            assert f"\n{'ABCDEFGHIJ'[i]}. {choice}\n" in q
        assert row["question"] in q and prompt_of(row).startswith(PROMPT_PREAMBLE)
    if name == "hellaswag":
        assert _rows(name)[0]["question"].startswith("Which ending completes the passage best?\nMaking tea: ")


def test_generative_predictions_are_greedy_decoding_of_their_prompts(tiny_model, toy_tokenizer, tmp_path):
    """The recorded prompt (its hash) of every question is the protocol's prompt for that row, and
    the recorded completion and prediction are what the reference loop's hard greedy decoding of
    that prompt alone gives."""
    model_dir = tmp_path / "model"
    tiny_model.save_pretrained(model_dir)
    toy_tokenizer.save_pretrained(model_dir)
    rows = toy_choice_rows(5, seed=4) + _rows("arc")
    result = evaluate_ood(str(model_dir), rows, "generative", cot_max_tokens=10, answer_max_tokens=4, batch_size=3,
                          loglik_batch_size=2, dtype="float32")
    assert result["protocol"] == "generative" and result["n_problems"] == len(rows)
    reference = ReferenceCotEngine(tiny_model, toy_tokenizer)
    for row, rec in zip(rows, result["problems"]):
        prompt = prompt_of(row)
        assert rec["prompt_sha256"] == prompt_hash(prompt)
        out = reference.generate([prompt], INFERENCE_SETTINGS["hard_greedy"], 0.0, [0], 10, 4)
        assert rec["completion"] == out.completions[0]
        assert rec["pred"] == read_choice(out.completions[0], row["choices"])
        assert rec["correct"] == (rec["pred"] == row["label"])
    assert result["accuracy"] == pytest.approx(sum(r["correct"] for r in result["problems"]) / len(rows))
    assert result["example_prompts"][0] == prompt_of(rows[0])
    json.dumps(result)  # the evaluation file is JSON


def test_cloze_protocol_is_the_loglik_argmax(tiny_model, toy_tokenizer, tmp_path):
    model_dir = tmp_path / "model"
    tiny_model.save_pretrained(model_dir)
    toy_tokenizer.save_pretrained(model_dir)
    rows = toy_choice_rows(6, seed=5)
    cloze = evaluate_ood(str(model_dir), rows, "cloze", 10, 4, 3, loglik_batch_size=4, dtype="float32")
    assert cloze["accuracy"] == cloze["accuracy_cloze"]
    assert all(p["correct"] == (p["pred_cloze"] == p["label"]) for p in cloze["problems"])
    with pytest.raises(ValueError, match="one of generative, cloze"):
        evaluate_ood(str(model_dir), rows, "letters", 10, 4, 3, 4, "float32")
