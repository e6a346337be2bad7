import json

import pytest

from softtokens.data.prompt import STOP_TEXT
from softtokens.data.rows import DataFormatError, read_jsonl
from softtokens.data.toy import toy_cot, toy_splits


def test_toy_generator_is_deterministic_and_seeded():
    a = toy_splits(50, 10, 10, seed=3)
    b = toy_splits(50, 10, 10, seed=3)
    c = toy_splits(50, 10, 10, seed=4)
    assert a == b
    assert a["test"] != c["test"]


def test_toy_splits_are_disjoint_and_sized():
    s = toy_splits(200, 20, 30, seed=1)
    assert [len(s[k]) for k in ("train", "validation", "test")] == [200, 20, 30]
    qs = [set(r["question"] for r in s[k]) for k in ("train", "validation", "test")]
    assert not (qs[0] & qs[1]) and not (qs[0] & qs[2]) and not (qs[1] & qs[2])
    assert len({r["id"] for k in s for r in s[k]}) == 250


def test_toy_cot_adds_correctly_and_ends_with_stop_text():
    cot = toy_cot(58, 74)
    assert cot == "58 + 74: 8 + 4 = 12, carry 1. 5 + 7 + 1 = 13, carry 1. Sum: 132. " + STOP_TEXT
    for row in toy_splits(100, 1, 1, seed=0)["train"]:
        assert f"Sum: {row['answer']}." in row["cot"]


def test_read_jsonl_names_file_and_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"id": 1, "question": "q", "answer": "1"}) + "\n{broken\n")
    with pytest.raises(DataFormatError, match=r"x.jsonl:2"):
        read_jsonl(p)
    p.write_text(json.dumps({"id": 1, "question": "q"}) + "\n")
    with pytest.raises(DataFormatError, match=r"x.jsonl:1: missing field\(s\) answer"):
        read_jsonl(p)


def test_forgetful_cot_drops_every_carry():
    assert toy_cot(58, 74, forget_carry=True) == "58 + 74: 8 + 4 = 12. 5 + 7 = 12. Sum: 122. " + STOP_TEXT
    # without a carry the slip changes nothing
    assert toy_cot(51, 23, forget_carry=True) == toy_cot(51, 23)


def test_toy_sum_is_what_the_cot_writes():
    from softtokens.data.toy import toy_sum

    assert toy_sum(58, 74) == 132 and toy_sum(58, 74, forget_carry=True) == 122
    assert toy_sum(99, 99, forget_carry=True) == 188 and toy_sum(51, 23, forget_carry=True) == 74


def test_the_prompt_is_the_papers_byte_for_byte():
    """The paper's GSM8K prompt example (Appendix "Format Following"), as its LaTeX renders it: the
    instruction, a line break (its `\\\\`), "User: QUESTION Assistant:"; then the trailing space
    its task prompt (Appendix B) has after "Assistant:". docs/protocol.md lists this."""
    from softtokens.data.prompt import format_prompt

    example = ("A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
               "The assistant first shows the complete reasoning process step by step, then provides the final "
               "answer in \\boxed{}. The assistant must always follow the format: 'User: [question] Assistant: "
               "[detailed reasoning] The final answer is: \\boxed{[answer]}.'\n"
               "User: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
               "How many clips did Natalia sell altogether in April and May? Assistant:")
    question = example.split("\nUser: ")[1].removesuffix(" Assistant:")
    assert format_prompt(question) == example + " "
