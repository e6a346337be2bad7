"""Grading throughput of the reward (``softtokens.reward.grader.grade``) against the gold reading it
replaced, on MATH-500-style answers, in the same process.

The baseline is the previous reward: gold read by math-verify's default extractors (bare text
first, ``$...$`` if that found nothing), math-verify's own signal time-outs. Both grade the same
(completion, gold) pairs; rounds alternate between the two so neither profits from a warmer
sympy cache, and each round starts with cold gold caches, as a fresh evaluation job does. A gold
is graded ``--per-gold`` times in a row (an evaluation file grades each problem's n samples).

Golds come from tests/fixtures/gold_shapes.jsonl (hand-written shapes of MATH-500, OlympiadBench,
DeepScaleR, GSM8K answers, with right and wrong completions), or from ``--golds FILE``: a JSONL of
prepared rows (``{"answer": ...}``, e.g. results/paper/data/math500/test.jsonl) or one gold per
line; completions are then made from each gold (its boxed copy, a wrong number, no box).

    python benchmarks/grading_speed.py
    python benchmarks/grading_speed.py --golds results/paper/data/math500/test.jsonl --rounds 5
    python benchmarks/grading_speed.py --pool 1 2   # in-process grading vs the grading pool (reward.pool)
"""

import argparse
import json
import logging
import re
import statistics
import time
from functools import lru_cache
from pathlib import Path

from math_verify import LatexExtractionConfig, parse, verify

from softtokens.data.sources import SOURCES
from softtokens.reward.grader import grade, parse_gold

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "gold_shapes.jsonl"
_BOXED_ONLY = [LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)]


@lru_cache(maxsize=65536)
def _baseline_gold(gold: str):
    return parse(gold) or parse(f"${gold}$")


def baseline_grade(completion: str, gold: str) -> tuple[bool, bool]:
    """The reward before the gold fix (math-verify's default time-outs of 5 s per call)."""
    pred = parse(completion, extraction_config=_BOXED_ONLY)
    if not pred:
        return False, False
    return True, bool(verify(_baseline_gold(gold), pred))


def boxed(answer: str) -> str:
    return f" \\boxed{{{answer}}}."


def fixture_pairs() -> list[tuple[str, str]]:
    pairs = []
    for line in FIXTURE.read_text().splitlines():
        case = json.loads(line)
        gold = SOURCES[case["source"]].normalise({"question": "q", "problem": "q", **case["raw"]})["answer"]
        answers = [gold, *case["right"], *case["wrong"], *case["wrong_old_accepted"]]
        pairs += [(boxed(a), gold) for a in answers] + [(" The answer is 7.", gold)]
    return pairs


def file_pairs(path: Path) -> list[tuple[str, str]]:
    text = path.read_text().splitlines()
    golds = [json.loads(x)["answer"] for x in text if x.strip()] if path.suffix == ".jsonl" else [x for x in text if x]
    pairs = []
    for gold in golds:
        wrong = re.sub(r"\d+", lambda m: str(int(m.group()) + 1), gold, count=1)
        pairs += [(boxed(gold), gold), (boxed(wrong if wrong != gold else gold + "+1"), gold), (" no box here", gold)]
    return pairs


def timed(fn, pairs: list[tuple[str, str]], per_gold: int) -> float:
    """Answers graded per second, gold caches cold at the start."""
    parse_gold.cache_clear()
    _baseline_gold.cache_clear()
    start = time.perf_counter()
    for completion, gold in pairs:
        for _ in range(per_gold):
            fn(completion, gold)
    return len(pairs) * per_gold / (time.perf_counter() - start)


CLEAR = "__clear the gold cache__"


def grade_or_clear(completion: str, gold: str, timeout_s):
    """reward.grader.grade in a pool worker; the completion CLEAR empties the worker's gold cache (a round's
    start, as parse_gold.cache_clear() does in this process)."""
    if completion == CLEAR:
        parse_gold.cache_clear()
        return (False, False, False)
    return grade(completion, gold, timeout_s)


def pool_throughput(pairs: list[tuple[str, str]], per_gold: int, rounds: int, workers: list[int]) -> None:
    """Answers per second: in-process reward.grader.grade (the SIGALRM budget only) against the grading
    pool (worker processes, a hard budget) at each worker count. Each pool is started and warmed
    once, as a training or evaluation job keeps its pool; rounds interleave, and every round starts
    with cold gold caches, in this process and in the workers alike."""
    from softtokens.reward.pool import GradingPool

    batch = [pair for pair in pairs for _ in range(per_gold)]
    pools = {w: GradingPool(w, grade_fn=grade_or_clear) for w in workers}
    for pool in pools.values():
        pool.grade_many(batch[:200])  # the workers are up and their imports done
    results = {"in-process": []} | {f"pool x{w}": [] for w in workers}
    for r in range(rounds):
        parse_gold.cache_clear()
        start = time.perf_counter()
        for c, g in batch:
            grade(c, g)
        results["in-process"].append(len(batch) / (time.perf_counter() - start))
        for w, pool in pools.items():
            pool.grade_many([(CLEAR, "")] * w * 4)
            start = time.perf_counter()
            pool.grade_many(batch)
            results[f"pool x{w}"].append(len(batch) / (time.perf_counter() - start))
    for pool in pools.values():
        pool.close()
    base = statistics.median(results["in-process"])
    print(f"{len(batch)} answers per round, {rounds} rounds")
    for name, xs in results.items():
        print(f"{name:12}: {statistics.median(xs):8.1f} answers/s  ratio {statistics.median(xs) / base:.3f}  "
              f"(rounds: {', '.join(f'{x:.0f}' for x in xs)})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--golds", type=Path, help="prepared rows (.jsonl) or one gold per line; default: the fixture")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-gold", type=int, default=4, help="times each (completion, gold) pair is graded in a row")
    ap.add_argument("--pool", type=int, nargs="*", help="worker counts: in-process grading vs the grading pool")
    a = ap.parse_args()
    logging.disable(logging.WARNING)  # math-verify logs each time-out; time-outs are not what is measured here
    pairs = file_pairs(a.golds) if a.golds else fixture_pairs()
    if a.pool:
        pool_throughput(pairs, a.per_gold, a.rounds, a.pool)
        return
    timed(grade, pairs[:20], 1)  # imports and regex compilation out of the way
    timed(baseline_grade, pairs[:20], 1)
    base, new = [], []
    for r in range(a.rounds):
        order = [(baseline_grade, base), (grade, new)] if r % 2 == 0 else [(grade, new), (baseline_grade, base)]
        for fn, out in order:
            out.append(timed(fn, pairs, a.per_gold))
    b, n = statistics.median(base), statistics.median(new)
    print(f"{len(pairs)} (completion, gold) pairs x {a.per_gold}, {a.rounds} rounds, golds from "
          f"{a.golds or FIXTURE.name}")
    print(f"baseline (old gold reading): {b:8.1f} answers/s   (rounds: {', '.join(f'{x:.0f}' for x in base)})")
    print(f"reward.grader.grade              : {n:8.1f} answers/s   (rounds: {', '.join(f'{x:.0f}' for x in new)})")
    print(f"ratio new / baseline       : {n / b:8.3f}")


if __name__ == "__main__":
    main()
