r"""The paper's reward: 100 if math-verify accepts the boxed answer, 10 if a box was found
but is wrong, 0 otherwise (Section 4, Reinforce with group baseline).

Gold answers are read as LaTeX math, the way math-verify's README recommends: wrapped as
``\boxed{...}``, then as ``$...$``, and as bare text only when neither yields a math value.
math-verify's default reading of bare text pulls a number out of LaTeX it cannot read
(``parse("3\sqrt{13}")`` gives ``[3]``, ``10,\!080`` gives ``[10]``), so a wrong completion
``\boxed{3}`` or ``\boxed{10}`` would earn 100. Completions count only through ``\boxed{}``.

Every graded answer has one wall-clock budget (``timeout_s``, SIGALRM in the main thread);
math-verify's own signal time-outs are switched off because each would cancel ours. An
answer that runs out of time is wrong and flagged ``timed_out`` so callers can count it.
The alarm interrupts Python code (sympy, mpmath), not a single C-level big-integer operation."""

from __future__ import annotations

import logging
import re
import signal
import threading
from contextlib import contextmanager
from functools import lru_cache
from typing import NamedTuple

from softtokens.config.grids import PAPER_RL

REWARD_CORRECT, REWARD_BOXED_WRONG, REWARD_NO_BOX = 100.0, 10.0, 0.0


# per answer: gold lookup, extraction and comparison together (the paper grid's rl.grading_timeout_s)
GRADING_TIMEOUT_S: float = PAPER_RL["grading_timeout_s"]


@lru_cache(maxsize=1)
def _math_verify():
    """math-verify and its reading rules, imported on first use: the modules that import this one
    (training, evaluation) also run where no answer is graded (``softtokens gpu-check``, which
    needs no math-verify).

    Returns (parse, verify, boxed-only extraction, the gold readings in order: (prefix, suffix,
    extraction config)). Only \\boxed{...} counts as a completion's answer: no fallback to the
    last number in the text."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropOwnTimeoutWarning())
    boxed_only = [LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)]
    gold_readings = (
        ("\\boxed{", "}", [LatexExtractionConfig(boxed_match_priority=0)]),
        ("$", "$", [LatexExtractionConfig()]),
        ("", "", [LatexExtractionConfig(), ExprExtractionConfig()]),
    )
    return parse, verify, boxed_only, gold_readings


class GradingTimeout(BaseException):
    """An answer ran past its time budget. A BaseException, so the ``except Exception``
    clauses inside math-verify and sympy cannot swallow it."""


class Grade(NamedTuple):
    boxed: bool             # a \boxed{} answer was extracted
    correct: bool           # math-verify judged it equal to the gold answer
    timed_out: bool = False  # the answer ran out of time (then correct is False)


class _DropOwnTimeoutWarning(logging.Filter):
    """math-verify warns once that its time-outs are off; ours replace them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


@contextmanager
def time_limit(seconds: float | None):
    """Raise GradingTimeout in the block after ``seconds`` of wall-clock time (None or 0: no limit)."""
    if not seconds or seconds <= 0:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("grading times each answer with SIGALRM, which works only in the main thread: "
                           "grade from the main thread or from worker processes")

    def on_alarm(signum, frame):
        raise GradingTimeout(f"grading took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# Two LaTeX forms math-verify misreads on both sides (so a boxed copy of the gold still matches and
# no check sees it): a mixed number before \% (`33\frac{1}{3}\%` reads as 1/300), and the thousands
# separators `,\!` / `{,}` (unambiguous in LaTeX; `1,\!200\%` reads as the set {1, 2}). Rewritten
# first in gold and completion alike: `\frac{100}{3}\%`, `1200\%`.
_THOUSANDS = re.compile(r"(?<=\d)(?:,\\!|\{,\})\s*(?=\d{3}(?!\d))")


_MIXED_PERCENT = re.compile(r"(?<![\d.])(\d+)\s*\\[dt]?frac\s*(?:\{(\d+)\}|(\d))\s*(?:\{(\d+)\}|(\d))\s*\\%")


def _as_fraction_percent(m: re.Match) -> str:
    whole, num, den = int(m[1]), int(m[2] or m[3]), int(m[4] or m[5])
    return f"\\frac{{{whole * den + num}}}{{{den}}}\\%"


def _rewrite(text: str) -> str:
    return _MIXED_PERCENT.sub(_as_fraction_percent, _THOUSANDS.sub("", text))


def _has_math_value(parsed: list) -> bool:
    from sympy import Basic, MatrixBase

    return any(isinstance(v, (Basic, MatrixBase)) for v in parsed)


# Letters glued to a number or a closing brace at the very end of an answer: `6m`, `2ab`, `\frac{1}{2}m`.
_GLUED_TAIL = re.compile(r"[\d}]([A-Za-z]{1,3})\s*$")


# Text math-verify reads as words (\text{...} and the like), environment names, command names.
_TEXT_COMMANDS = re.compile(r"\\(?:text\w*|mbox|mathrm|operatorname|begin|end)\s*\{[^{}]*\}")


_COMMAND_NAME = re.compile(r"\\[A-Za-z]+")


_WORD = re.compile(r"(?<![A-Za-z])[A-Za-z]{4,}(?![A-Za-z])")


def _is_prose(gold: str) -> bool:
    """A word of four or more letters outside \\text{} (`f(x)=2x+c, where c is ...`): math-verify
    reads it as a product of single-letter symbols, so only a verbatim copy could match."""
    return bool(_WORD.search(_COMMAND_NAME.sub(" ", _TEXT_COMMANDS.sub(" ", gold))))


def _unit_swallows_variable(gold: str, values: tuple) -> bool:
    """math-verify strips unit words that end an answer, one- and two-letter ones included (m, s,
    t, h, d, g, ab, ...): a gold `6m` reads as 6 and would pay 100 for a wrong `\\boxed{6}`. Units
    written as words after a space (`5 cm`) or in \\text{} keep their usual reading."""
    tail = _GLUED_TAIL.search(gold)
    if not tail:
        return False
    from sympy import Basic

    names = {str(sym) for v in values if isinstance(v, Basic) for sym in v.free_symbols}
    return not any(tail.group(1) in name or name in tail.group(1) for name in names)


@lru_cache(maxsize=65536)
def parse_gold(gold: str) -> tuple:
    """math-verify's reading of a gold answer: the first reading that yields a math value, else
    the boxed reading's text alone (then only an identical boxed text can match; data
    preparation drops such rows, see ``gold_problem``).

    Parsed once per distinct gold string and cached, so a problem's G samples share it."""
    parse, _, _, gold_readings = _math_verify()
    readings, text = [], _rewrite(gold)
    for prefix, suffix, config in gold_readings:
        readings.append(parse(prefix + text + suffix, extraction_config=config, parsing_timeout=None))
        if _has_math_value(readings[-1]):
            return tuple(readings[-1])
    return tuple(readings[0])


def extract_boxed(completion: str) -> list:
    """The parsed \\boxed{} answer of a completion, or an empty list if there is none."""
    parse, _, boxed_only, _ = _math_verify()
    return parse(_rewrite(completion), extraction_config=boxed_only, parsing_timeout=None)


def warm_up() -> None:
    """Import math-verify and let it read one expression, outside any answer's budget: its first
    use imports sympy and its LaTeX grammar (seconds; more from a network file system), which an
    answer's time limit must not pay for."""
    parse = _math_verify()[0]
    parse("$1$")


def grade(completion: str, gold: str, timeout_s: float | None = GRADING_TIMEOUT_S) -> Grade:
    """Grade one completion against its gold answer within ``timeout_s`` seconds."""
    boxed = False
    _math_verify()  # imported before the clock starts (warm_up)
    try:
        with time_limit(timeout_s):
            gold_values = parse_gold(gold)
            pred = extract_boxed(completion)
            if not pred:
                return Grade(False, False)
            boxed = True
            verify = _math_verify()[1]
            return Grade(True, bool(verify(list(gold_values), pred, timeout_seconds=None)))
    except GradingTimeout:
        return Grade(boxed, False, timed_out=True)


def reward_of_grade(g: Grade, correct: float = REWARD_CORRECT, boxed_wrong: float = REWARD_BOXED_WRONG,
                    no_box: float = REWARD_NO_BOX) -> float:
    """The paper's reward table applied to a ``grade`` result."""
    if g.correct:
        return correct
    return boxed_wrong if g.boxed else no_box


def reward(completion: str, gold: str, correct: float = REWARD_CORRECT,
           boxed_wrong: float = REWARD_BOXED_WRONG, no_box: float = REWARD_NO_BOX) -> float:
    """Reward of ``completion`` (the text after the CoT, e.g. ``" \\boxed{72}."``) against gold."""
    return reward_of_grade(grade(completion, gold), correct=correct, boxed_wrong=boxed_wrong, no_box=no_box)


@lru_cache(maxsize=65536)
def gold_problem(gold: str, timeout_s: float | None = GRADING_TIMEOUT_S) -> str | None:
    """Why a gold answer cannot serve the reward, or None if its own boxed copy earns the full
    reward. The reason is what data preparation counts a dropped row under."""
    _math_verify()
    try:
        with time_limit(timeout_s):
            values = parse_gold(gold)
    except GradingTimeout:
        return "gold parse timed out"
    if not _has_math_value(values):
        return "gold unreadable by math-verify"
    if _is_prose(gold):
        return "gold is prose, not math"
    if _unit_swallows_variable(gold, values):
        return "gold ends in a variable math-verify strips as a unit"
    g = grade(" \\boxed{" + gold + "}.", gold, timeout_s)
    if g.timed_out:
        return "grading the boxed gold timed out"
    if not g.correct:
        return "boxed gold does not earn the full reward"
    return None


# ---------------------------------------------------------------- answer extraction
def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces; also the
    brace-less ``\\boxed 5`` form Hendrycks MATH uses a few times."""
    starts = [m for m in re.finditer(r"\\(?:boxed|fbox)\s*(\{)?", text)]
    for m in reversed(starts):
        if m.group(1) is None:  # \boxed 5 : up to the next space or $
            tail = re.match(r"([^\s$]+)", text[m.end():])
            if tail:
                return tail.group(1)
            continue
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            content = text[m.end(): i - 1].strip()
            if content:
                return content
    return None
