"""The reward on the shapes real gold answers take (tests/fixtures/gold_shapes.jsonl: hand-written
golds in the style of MATH, MATH-500, OlympiadBench, DeepScaleR and GSM8K, each run through its
source's loader), on the examples the old gold parser got wrong, and its per-answer time-out."""

import json
import signal
import threading
import time
from pathlib import Path

import pytest
from math_verify import LatexExtractionConfig, parse, verify

from softtokens.data.sources import SOURCES
from softtokens.reward.grader import (
    REWARD_BOXED_WRONG,
    REWARD_CORRECT,
    REWARD_NO_BOX,
    Grade,
    GradingTimeout,
    gold_problem,
    grade,
    reward,
    reward_of_grade,
    time_limit,
)

SHAPES = [json.loads(line) for line in (Path(__file__).parent / "fixtures" / "gold_shapes.jsonl").read_text().splitlines()]


def boxed(answer: str) -> str:
    return " \\boxed{" + answer + "}."


def loader_gold(case: dict) -> str:
    """The gold answer our loader makes of the case's raw row."""
    return SOURCES[case["source"]].normalise({"question": "q", "problem": "q", **case["raw"]})["answer"]


def old_reward(completion: str, gold: str) -> float:
    """The reward before this fix: gold read with math-verify's default extractors, bare text first."""
    pred = parse(completion, extraction_config=[LatexExtractionConfig(boxed_match_priority=0,
                                                                      try_extract_without_anchor=False)])
    if not pred:
        return REWARD_NO_BOX
    return REWARD_CORRECT if verify(parse(gold) or parse(f"${gold}$"), pred) else REWARD_BOXED_WRONG


@pytest.mark.parametrize("case", SHAPES, ids=[f"{c['source']}: {c['shape']}" for c in SHAPES])
def test_gold_shapes(case):
    gold = loader_gold(case)
    assert gold_problem(gold) is None, gold                      # prepare-data keeps the row
    assert reward(boxed(gold), gold) == REWARD_CORRECT           # its own boxed copy earns 100
    for right in case["right"]:                                  # the same answer in another form
        assert reward(boxed(right), gold) == REWARD_CORRECT, right
    for wrong in case["wrong"] + case["wrong_old_accepted"]:
        assert reward(boxed(wrong), gold) == REWARD_BOXED_WRONG, wrong
    for wrong in case["wrong_old_accepted"]:                     # the old parser paid 100 for these
        assert old_reward(boxed(wrong), gold) == REWARD_CORRECT, wrong


def test_every_listed_shape_has_an_old_misreading_case():
    """Each kind of gold answer the issue lists comes with a wrong answer the old parser paid for."""
    with_old = {c["shape"] for c in SHAPES if c["wrong_old_accepted"]}
    for shape in ("tuple with \\left( \\right)", "half-open interval", "brace-less \\frac", "mixed number with \\dfrac",
                  "thousands separator ,\\!", "thousands separator {,}", "radical", "complex number", "column vector",
                  "line equation", "union of intervals", "degrees, two answers", "text with a number",
                  "list of answers", "several answers", "units in \\text", "percent, mixed number",
                  "answers with inner $", "\\max in a subscript"):
        assert shape in with_old, shape
    assert {c["source"] for c in SHAPES} == {"math500", "math", "olympiadbench", "deepscaler", "gsm8k"}


def test_the_issue_examples():
    assert reward(boxed("2"), "2n-2") == REWARD_BOXED_WRONG
    assert reward(boxed("10"), "10,\\!080") == REWARD_BOXED_WRONG
    assert reward(boxed("10080"), "10,\\!080") == REWARD_CORRECT
    assert reward(boxed("59"), "\\frac 59") == REWARD_BOXED_WRONG
    assert reward(boxed("\\frac{5}{9}"), "\\frac 59") == REWARD_CORRECT
    assert reward(boxed("1.3"), "1,3,5") == REWARD_BOXED_WRONG
    assert reward(boxed("5, 3, 1"), "1,3,5") == REWARD_CORRECT
    assert reward(boxed("3"), "3\\sqrt{13}") == REWARD_BOXED_WRONG


def test_correct_boxed_answer_and_equivalent_forms():
    assert reward(" \\boxed{72}.", "72") == REWARD_CORRECT == 100.0
    assert reward(" \\boxed{\\frac{1}{2}}.", "0.5") == 100.0
    assert reward(" \\boxed{0.5}", "\\frac{1}{2}") == 100.0


def test_boxed_but_wrong():
    assert reward(" \\boxed{71}.", "72") == REWARD_BOXED_WRONG == 10.0


def test_no_box_scores_zero_even_if_the_number_is_right():
    assert reward(" 72.", "72") == REWARD_NO_BOX == 0.0
    assert reward(" \\boxed{72", "72") == 0.0  # unclosed box is not an answer


def test_custom_reward_values():
    assert reward(" \\boxed{3}", "4", correct=1.0, boxed_wrong=-1.0, no_box=-2.0) == -1.0
    assert reward_of_grade(Grade(False, False), no_box=-2.0) == -2.0
    assert reward_of_grade(Grade(True, False, timed_out=True)) == REWARD_BOXED_WRONG


def test_mixed_number_percent_and_separators_read_alike_in_gold_and_completion():
    """math-verify alone reads 37\\frac{1}{2}\\% as 1/200 and 1,\\!500\\% as the set {1, 5}."""
    assert reward(boxed("37.5\\%"), "37\\frac{1}{2}\\%") == REWARD_CORRECT
    assert reward(boxed("37\\frac12\\%"), "37\\frac{1}{2}\\%") == REWARD_CORRECT
    assert reward(boxed("0.005"), "37\\frac{1}{2}\\%") == REWARD_BOXED_WRONG
    assert reward(boxed("1500\\%"), "1,\\!500\\%") == REWARD_CORRECT
    assert reward(boxed("1{,}500\\%"), "1,\\!500\\%") == REWARD_CORRECT


def test_gold_problems_name_why_a_row_is_dropped():
    assert gold_problem("q(2,5]") == "gold unreadable by math-verify"
    assert gold_problem("g(x)=x for all x, where x is any odd integer") == "gold is prose, not math"
    assert gold_problem("7m") == "gold ends in a variable math-verify strips as a unit"  # would pay 100 for 7
    assert reward(boxed("7"), "7m") == REWARD_CORRECT  # (why: math-verify reads 7m as 7 metres)
    for fine in ("5 \\text{ cm}", "2n", "\\text{Evelyn}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "90^\\circ"):
        assert gold_problem(fine) is None, fine


def test_an_unreadable_gold_still_grades_by_its_text():
    """reward() never raises on a gold prepare-data would drop: only the identical text matches."""
    assert reward(boxed("q(2,5]"), "q(2,5]") == REWARD_CORRECT
    assert reward(boxed("5"), "q(2,5]") == REWARD_BOXED_WRONG


def test_a_slow_answer_times_out_and_is_counted():
    before = signal.getsignal(signal.SIGALRM)
    start = time.perf_counter()
    g = grade(boxed("9^{9^{9}}"), "42", timeout_s=0.5)  # sympy evaluates a 370-million-digit power
    assert time.perf_counter() - start < 3.0
    assert g == Grade(boxed=True, correct=False, timed_out=True)
    assert signal.getsignal(signal.SIGALRM) is before           # the previous handler is back
    assert grade(boxed("42"), "42", timeout_s=0.5) == Grade(True, True, False)  # and grading goes on


def test_time_limit_interrupts_python_code_and_refuses_other_threads():
    with pytest.raises(GradingTimeout):
        with time_limit(0.2):
            while True:
                pass
    errors = []
    worker = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, grade, boxed("1"), "1")))
    worker.start()
    worker.join()
    assert "main thread" in str(errors[0].value)
