"""RLOO training of one (model, dataset, mode, seed) run (Section 4 and Appendix A).

One step: B prompts x G rollouts in the run's CoT mode -> rewards -> leave-one-out
advantages -> one teacher-forced pass per micro-batch -> AdamW step. Greedy validation every
``val_every`` steps picks the ``best`` checkpoint among trained steps (>= 1); the base model is
validated at step 0 too, as the reference a trained checkpoint is compared with, never as a
candidate (the paper tests "the best performing [model] under our greedy validation" of a run).

Resume state (``latest``, ``best`` so far, metrics so far) lives in ``state_dir``, which the
workflow does not declare as an output: Snakemake deletes declared outputs of a failed job,
and a preempted 4k-step run must not lose its progress. On success the checkpoints are
moved into the declared ``checkpoints/`` directory and the state directory is removed."""

from __future__ import annotations

import torch

from softtokens.data.prompt import format_prompt
from softtokens.engine.cot import CotEngine
from softtokens.engine.settings import EMBEDDING, CotSetting, Placement
from softtokens.reward.grader import GRADING_TIMEOUT_S, grade


def grade_in_process(pairs: list[tuple[str, str]], timeout_s: float = GRADING_TIMEOUT_S) -> list:
    """Grades one after the other in this process (SIGALRM budget only): the toy base's check."""
    return [grade(c, g, timeout_s) for c, g in pairs]


@torch.no_grad()
def greedy_validation(engine: CotEngine, rows: list[dict], setting: CotSetting, cot_max: int,
                      answer_max: int, batch_size: int = 256, timeout_s: float = GRADING_TIMEOUT_S,
                      placement: Placement = EMBEDDING, grade_all=None) -> tuple[list, list]:
    """Each row's generation (engine.rollout.RowResult, in the order of ``rows``) and grade, with
    a noise-free CoT and a greedy answer (the paper's greedy validation: no Gaussian noise, so
    sigma plays no part). ``grade_all(pairs)`` grades (completion, gold) pairs: a grading pool's
    in a training run."""
    prompts = [format_prompt(r["question"]) for r in rows]
    finished = sorted(engine.stream(prompts, [0] * len(rows), setting, 0.0, cot_max, answer_max,
                                    batch_size=batch_size, placement=placement), key=lambda r: r.job)
    pairs = [(row.completion, rows[row.job]["answer"]) for row in finished]
    graded = grade_all(pairs) if grade_all is not None else grade_in_process(pairs, timeout_s)
    return finished, graded


def greedy_correct(engine: CotEngine, rows: list[dict], setting: CotSetting, cot_max: int,
                   answer_max: int, batch_size: int = 256, timeout_s: float = GRADING_TIMEOUT_S,
                   placement: Placement = EMBEDDING, grade_all=None) -> int:
    """Number of rows answered correctly under greedy validation."""
    _, graded = greedy_validation(engine, rows, setting, cot_max, answer_max, batch_size, timeout_s, placement,
                                  grade_all)
    return sum(g.correct for g in graded)


def greedy_accuracy(engine: CotEngine, rows: list[dict], setting: CotSetting, cot_max: int,
                    answer_max: int, batch_size: int = 256) -> float:
    return greedy_correct(engine, rows, setting, cot_max, answer_max, batch_size) / len(rows)
