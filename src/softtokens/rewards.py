"""The paper's reward: 100 if math-verify accepts the boxed answer, 10 if a box was found
but is wrong, 0 otherwise (Section 4, Reinforce with group baseline).

math-verify's time-outs use signal.alarm, which only works in the main thread: call these
from the main thread (our training and evaluation loops do) or from worker processes.
"""

from __future__ import annotations

from functools import lru_cache

from math_verify import LatexExtractionConfig, parse, verify

REWARD_CORRECT, REWARD_BOXED_WRONG, REWARD_NO_BOX = 100.0, 10.0, 0.0

# Only \boxed{...} counts as an answer: no fallback to the last number in the text.
_BOXED_ONLY = [LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)]


@lru_cache(maxsize=65536)
def _parse_gold(gold: str):
    parsed = parse(gold)
    if not parsed:  # a bare expression math-verify cannot read; try it as LaTeX math
        parsed = parse(f"${gold}$")
    return parsed


def extract_boxed(completion: str):
    """The parsed \\boxed{} answer of a completion, or an empty list if there is none."""
    return parse(completion, extraction_config=_BOXED_ONLY)


def grade(completion: str, gold: str) -> tuple[bool, bool]:
    """(boxed answer found, answer correct)."""
    pred = extract_boxed(completion)
    if not pred:
        return False, False
    return True, bool(verify(_parse_gold(gold), pred))


def reward_of_grade(boxed: bool, ok: bool, correct: float = REWARD_CORRECT,
                    boxed_wrong: float = REWARD_BOXED_WRONG, no_box: float = REWARD_NO_BOX) -> float:
    """The paper's reward table applied to a ``grade`` result."""
    if ok:
        return correct
    return boxed_wrong if boxed else no_box


def reward(completion: str, gold: str, correct: float = REWARD_CORRECT,
           boxed_wrong: float = REWARD_BOXED_WRONG, no_box: float = REWARD_NO_BOX) -> float:
    """Reward of ``completion`` (the text after the CoT, e.g. ``" \\boxed{72}."``) against gold."""
    return reward_of_grade(*grade(completion, gold), correct=correct, boxed_wrong=boxed_wrong, no_box=no_box)
