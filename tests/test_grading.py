"""The grading pool: the same grades as in-process grading, and an answer stuck in one C call is a
time-out within its budget while grading goes on (a worker killed and replaced)."""

import time

import pytest
from grading_helpers import crash, grade_or_hang

from softtokens.reward.grader import Grade, grade
from softtokens.reward.pool import KILL_MARGIN_S, MAX_DEAD, GradingPool

PAIRS = [(" \\boxed{72}.", "72"), (" \\boxed{0.5}.", "\\frac{1}{2}"), (" \\boxed{7}.", "72"), (" no box", "72"),
         (" \\boxed{\\frac{3}{4}}", "0.75"), (" \\boxed{x^2+1}", "1+x^2")]


def test_pool_grades_as_in_process():
    with GradingPool(workers=2, timeout_s=5.0) as pool:
        assert pool.grade_many(PAIRS) == [grade(c, g, 5.0) for c, g in PAIRS]
        assert pool.grade_many([]) == []


def test_an_answer_stuck_in_c_times_out_and_grading_goes_on():
    pairs = [(" \\boxed{72}.", "72"), ("hang", "72"), (" \\boxed{3}.", "3")]
    with GradingPool(workers=1, timeout_s=0.5, grade_fn=grade_or_hang) as pool:
        pool.grade_many(pairs[:1])  # the worker is up
        start = time.monotonic()
        got = pool.grade_many(pairs)
        elapsed = time.monotonic() - start
        assert got == [Grade(True, True), Grade(False, False, timed_out=True), Grade(True, True)]
        assert pool.killed == 1
        assert elapsed < 0.5 + KILL_MARGIN_S + 10  # the budget, the margin and a new worker's start


@pytest.mark.slow
def test_training_goes_on_past_an_answer_stuck_in_c(tmp_path, monkeypatch, toy_rows, toy_tokenizer):
    """A training step whose grading meets an answer stuck in one C call: that answer is a time-out
    (counted in the step's grading_timeouts), the worker is replaced, and the run goes on."""
    from conftest import make_tiny_model
    from grading_helpers import hang_once

    from softtokens.train.config import TrainConfig
    from softtokens.train.loop import Trainer

    base = tmp_path / "base"
    make_tiny_model(toy_tokenizer, seed=3).save_pretrained(base)
    toy_tokenizer.save_pretrained(base)
    marker = tmp_path / "hang"
    marker.touch()
    monkeypatch.setenv("SOFTTOKENS_TEST_HANG_ONCE", str(marker))
    cfg = TrainConfig.paper(mode="hard", seed=0, lr=1e-4, prompts_per_step=2, samples_per_prompt=2, steps=2, warmup_steps=1,
                      cot_max_tokens=6, answer_max_tokens=3, val_every=100, val_size=2, micro_batch_size=4,
                      compute_dtype="float32", grading_timeout_s=0.5)
    pool = GradingPool(1, 0.5, grade_fn=hang_once)
    trainer = Trainer(cfg, str(base), toy_rows["train"], toy_rows["validation"], tmp_path / "_resume",
                      grading_pool=pool)
    start = time.monotonic()
    rows = [trainer.train_step(step) for step in range(2)]
    assert time.monotonic() - start < 60
    assert rows[0]["grading_timeouts"] == 1 and rows[1]["grading_timeouts"] == 0
    assert pool.killed == 1 and not marker.exists()
    trainer.close()


def test_a_stop_signal_is_the_parents_not_the_workers():
    """SLURM signals every process of a job: a worker that died of SIGTERM would turn the answer it
    was grading into a time-out (and a resumed run would differ). Workers ignore it; the parent
    ends them, also when it exits without closing the pool."""
    import os
    import signal
    import subprocess
    import sys

    with GradingPool(workers=1, timeout_s=5.0) as pool:
        pool.grade("\\boxed{1}", "1")  # the worker is up
        (proc, _), = pool._procs
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.5)
        assert proc.is_alive()
        assert pool.grade("so \\boxed{2}", "2") == Grade(True, True, False) and pool.killed == 0
    code = ("from softtokens.reward.pool import GradingPool\n"
            "pool = GradingPool(1, 5.0)\nprint(pool.grade('\\\\boxed{3}', '3'))\n")  # never closed
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "True" in r.stdout, r.stderr[-2000:]


@pytest.mark.slow
def test_a_slow_worker_start_is_not_on_an_answers_clock(monkeypatch):
    """A worker's start-up (interpreter, imports: seconds on a loaded node or a network file
    system) runs before its first answer's budget, at the first start and after a replacement."""
    monkeypatch.setenv("SOFTTOKENS_TEST_WORKER_START_S", str(1.0 + KILL_MARGIN_S + 0.5))  # past the budget
    with GradingPool(workers=1, timeout_s=1.0, grade_fn=grade_or_hang) as pool:
        assert pool.grade_many(PAIRS[:2]) == [Grade(True, True, False)] * 2
        hung, after = pool.grade_many([("hang", "72"), (" \\boxed{72}", "72")])
        assert hung.timed_out and after == Grade(True, True, False) and pool.killed == 1


def test_answers_that_hang_in_a_row_are_time_outs_not_a_broken_pool():
    """However many answers in a row outlive their budget, each is a time-out and grading goes on."""
    hangs = [("hang", "72")] * (MAX_DEAD + 1)
    with GradingPool(workers=1, timeout_s=0.2, grade_fn=grade_or_hang) as pool:
        grades = pool.grade_many(hangs + [(" \\boxed{72}", "72")])
    assert [g.timed_out for g in grades] == [True] * len(hangs) + [False] and grades[-1].correct


def test_a_grader_that_cannot_run_stops_the_job_saying_so(monkeypatch):
    """A grader that raises on every answer would score every answer zero; a worker that cannot
    start (an import error) would never grade: both stop the job after MAX_DEAD tries, saying so."""
    with pytest.raises(RuntimeError, match=f"died {MAX_DEAD} times in a row"):
        GradingPool(workers=1, timeout_s=5.0, grade_fn=crash).grade_many(PAIRS)
    monkeypatch.setenv("SOFTTOKENS_TEST_WORKER_CANNOT_START", "1")
    with pytest.raises(RuntimeError, match=f"failed to start {MAX_DEAD} times in a row"):
        GradingPool(workers=1, timeout_s=5.0, grade_fn=grade_or_hang).grade_many(PAIRS)
