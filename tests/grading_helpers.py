"""Graders the grading pool's workers import in the tests (a spawned worker cannot be monkeypatched)."""

import os
import re
import time

from softtokens.reward.grader import grade

# A worker imports this module when it starts (spawn): these make that start slow or fail. The
# test process imported it before setting them, so only the workers it then starts see them.
time.sleep(float(os.environ.get("SOFTTOKENS_TEST_WORKER_START_S", "0")))
if os.environ.get("SOFTTOKENS_TEST_WORKER_CANNOT_START"):
    raise ImportError("this grading worker cannot start (SOFTTOKENS_TEST_WORKER_CANNOT_START)")


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


def crash(completion: str, gold: str, timeout_s: float | None):
    """A grader with a bug: every answer raises, and the worker dies of it."""
    raise ValueError("a grader bug")
