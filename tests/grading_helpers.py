"""Graders the grading pool's workers import in the tests (a spawned worker cannot be monkeypatched)."""

import re

from softtokens.reward.grader import grade


def grade_or_hang(completion: str, gold: str, timeout_s: float | None):
    """The reward, except that the completion "hang" runs a regular expression that backtracks for
    hours inside one C call, where no signal (SIGALRM) can interrupt it."""
    if completion == "hang":
        re.match(r"(a+)+$", "a" * 64 + "b")
    return grade(completion, gold, timeout_s)


def hang_once(completion: str, gold: str, timeout_s: float | None):
    """The reward, except that the first answer graded after the marker file named by
    $SOFTTOKENS_TEST_HANG_ONCE was made hangs in one C call (the marker is removed first)."""
    import os

    marker = os.environ.get("SOFTTOKENS_TEST_HANG_ONCE")
    if marker and os.path.exists(marker):
        os.remove(marker)
        re.match(r"(a+)+$", "a" * 64 + "b")
    return grade(completion, gold, timeout_s)


def constant(completion: str, gold: str, timeout_s: float | None):
    """No grading at all: the pool's own cost, for benchmarks/grading_speed.py's overhead line."""
    from softtokens.reward.grader import Grade

    return Grade(True, completion == gold)
