"""Datasets as JSONL rows ``{"id", "question", "answer"}`` and the paper's prompt.

The toy generator makes short addition word problems whose reference chain of thought adds
column by column: a tiny model learns it in minutes but its greedy decode is often wrong,
which is what RL needs to have something to improve."""

from __future__ import annotations

import random

from softtokens.data.prompt import STOP_TEXT, format_prompt

# ---------------------------------------------------------------- toy arithmetic
_NAMES = ["Ada", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ines", "Jon", "Kai", "Lena"]


_ITEMS = ["apples", "stamps", "marbles", "books", "coins", "shells", "cards", "beads"]


_TEMPLATES = [
    "{name} has {a} {item}. {name} gets {b} more {item}. How many {item} does {name} have now?",
    "A box holds {a} {item} and another box holds {b} {item}. How many {item} are there in total?",
    "{name} collected {a} {item} on Monday and {b} {item} on Tuesday. How many {item} did {name} collect?",
    "There are {a} {item} in a jar. {name} adds {b} {item}. How many {item} are in the jar?",
]


def toy_cot(a: int, b: int, forget_carry: bool = False) -> str:
    """Reference CoT: add column by column with carries, then state the sum.

    E.g. 58 + 74 -> '58 + 74: 8 + 4 = 12, carry 1. 5 + 7 + 1 = 13, carry 1. Sum: 132.
    The final answer is:'. With ``forget_carry`` it makes the classic slip of dropping the
    carries ('8 + 4 = 12. 5 + 7 = 12. Sum: 122.'), which the toy base partly imitates."""
    steps, total = _columns(a, b, forget_carry)
    return f"{a} + {b}: " + " ".join(steps) + f" Sum: {total}. {STOP_TEXT}"


def toy_sum(a: int, b: int, forget_carry: bool = False) -> int:
    """The sum that toy_cot writes: a + b, or the slip's wrong sum."""
    return _columns(a, b, forget_carry)[1]


def _columns(a: int, b: int, forget_carry: bool) -> tuple[list[str], int]:
    da, db = str(a)[::-1], str(b)[::-1]
    carry, steps, digits = 0, [], []
    columns = max(len(da), len(db))
    for i in range(columns):
        terms = [int(d[i]) for d in (da, db) if i < len(d)] + ([carry] if carry else [])
        s = sum(terms)
        carry = 0 if forget_carry else s // 10
        digits.append(str(s) if i == columns - 1 else str(s % 10))
        steps.append(" + ".join(map(str, terms)) + f" = {s}" + (f", carry {carry}." if carry else "."))
    return steps, int("".join(reversed(digits)))


def toy_problem(rng: random.Random, pid: str, lo: int = 10, hi: int = 99) -> dict:
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    template = rng.choice(_TEMPLATES)
    question = template.format(name=rng.choice(_NAMES), item=rng.choice(_ITEMS), a=a, b=b)
    return {"id": pid, "question": question, "answer": str(a + b), "cot": toy_cot(a, b), "operands": [a, b]}


def toy_splits(train_size: int, validation_size: int, test_size: int, seed: int) -> dict[str, list[dict]]:
    """Disjoint, seeded splits. Validation is a fixed seeded slice held out of the training pool."""
    rng = random.Random(seed)
    seen: set[str] = set()
    pool: list[dict] = []
    total = train_size + validation_size + test_size
    while len(pool) < total:
        row = toy_problem(rng, pid="")
        if row["question"] in seen:
            continue
        seen.add(row["question"])
        pool.append(row)
    test, trainval = pool[:test_size], pool[test_size:]
    rng.shuffle(trainval)
    splits = {"test": test, "validation": trainval[:validation_size], "train": trainval[validation_size:]}
    for name, rows in splits.items():
        for i, row in enumerate(rows):
            row["id"] = f"toyarith-{name}-{i:05d}"
    return splits


def worked_solution(a: int, b: int, forget_carry: bool = False, total: int | None = None) -> str:
    """The column work of toy_cot after "a + b:", ending in its sum (``total``: another sum written instead)."""
    steps, written = _columns(a, b, forget_carry)
    return " ".join(steps) + f" Sum: {written if total is None else total}."


def toy_choice_rows(size: int, seed: int) -> list[dict]:
    """Synthetic multiple-choice rows for the toy grid's out-of-domain stage (which stands in for HellaSwag / ARC /
    MMLU on a laptop): a toy word problem and four worked solutions after "a + b:", of which one is right: the
    column sums with their carries and the true total; the slip of dropping the carries (the toy base was supervised
    on it in a share of its CoTs: model.toy); the right columns with a total 10 or 1 off. The model judges whole
    written solutions rather than writing one: a format it was never trained on, probing the carries it learned.
    The base prefers the slip where a carry happens, so it stands well below ceiling (the earlier design, which gave
    the columns and asked for the total, was read off the context: every model scored 100 %, the OOD table said
    nothing). The NLL is the right solution's, per token."""
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < size:
        problem = toy_problem(rng, pid="")
        (a, b), q = problem["operands"], problem["question"]
        if q in seen:
            continue
        seen.add(q)
        right = a + b
        choices = [worked_solution(a, b)]
        if toy_sum(a, b, True) != right:
            choices.append(worked_solution(a, b, forget_carry=True))
        for off in (10, -1, 1, -10, 2):
            if len(choices) < 4 and right + off >= 0:
                choices.append(worked_solution(a, b, total=right + off))
        order = list(range(len(choices)))
        rng.shuffle(order)
        rows.append({"id": f"toychoice-test-{len(rows):05d}", "question": q,
                     "context": format_prompt(q) + f"{a} + {b}:",
                     "choices": [choices[i] for i in order], "label": order.index(0)})
    return rows
