"""The training job: resuming after a crash continues the same run, best checkpoints, sigma.
(Two processes under FSDP against one, at the paper's precision: tests/test_paper_path.py.)"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from softtokens.train.config import TrainConfig
from softtokens.train.loop import Trainer

CFG = dict(mode="soft", seed=3, lr=1e-3, prompts_per_step=2, samples_per_prompt=4, steps=3, warmup_steps=1,
           cot_max_tokens=10, answer_max_tokens=4, val_every=1, val_size=6, micro_batch_size=3, compute_dtype="float32")
TRAIN_KEYS = ("reward", "frac_correct", "completions/mean_length", "stop_rate")




def train_rows(metrics):
    return [m for m in metrics if m["kind"] == "train"]


def run_in_process(base, toy_rows, out: Path, cfg: TrainConfig, crash_at: int | None = None, grader=None) -> Trainer:
    trainer = Trainer(cfg, str(base / "model"), toy_rows["train"], toy_rows["validation"], out / "_resume",
                      grader=grader)
    if crash_at is not None:
        real = trainer.train_step

        def crashing(step):
            if step == crash_at:
                raise RuntimeError("preempted")
            return real(step)
        trainer.train_step = crashing
        with pytest.raises(RuntimeError, match="preempted"):
            trainer.run()
        return trainer
    trainer.run()
    trainer.finish(out / "checkpoints", out / "metrics.jsonl")
    return trainer


@pytest.mark.slow
def test_resume_after_a_crash_continues_the_same_run(base, toy_rows, tmp_path):
    cfg = TrainConfig.paper(**CFG)
    straight = run_in_process(base, toy_rows, tmp_path / "straight", cfg)
    run_in_process(base, toy_rows, tmp_path / "resumed", cfg, crash_at=2)
    assert (tmp_path / "resumed" / "_resume" / "latest" / "optimizer").is_dir()  # sharded AdamW state (DCP)
    resumed = run_in_process(base, toy_rows, tmp_path / "resumed", cfg)
    assert resumed.start_step == 2
    a, b = train_rows(straight.metrics), train_rows(resumed.metrics)
    assert [m["step"] for m in b] == [1, 2, 3]
    for x, y in zip(a, b):
        for k in (*TRAIN_KEYS, "loss", "grad_norm"):
            assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-7), k
    wa = load_file(tmp_path / "straight" / "checkpoints" / "latest" / "model.safetensors")
    wb = load_file(tmp_path / "resumed" / "checkpoints" / "latest" / "model.safetensors")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    assert not (tmp_path / "resumed" / "_resume").exists()


def test_best_checkpoint_is_a_trained_step(base, toy_rows, tmp_path):
    """The base model is validated at step 0 as the reference, never kept as 'best' (the untrained
    tiny model ties at every validation, which used to leave step 0 as the best)."""
    from softtokens.train.selection import check_checkpoint, select_best

    cfg = TrainConfig.paper(**CFG)
    trainer = run_in_process(base, toy_rows, tmp_path, cfg)
    vals = [m for m in trainer.metrics if m["kind"] == "validation"]
    assert [m["step"] for m in vals] == [0, 1, 2, 3]
    best = json.loads((tmp_path / "checkpoints" / "best" / "trainer_state.json").read_text())
    chosen = select_best(trainer.metrics)
    assert best["step"] == chosen["step"] >= 1
    assert best["base_val"] == vals[0]["val_greedy_accuracy"] == chosen["base_val_greedy_accuracy"]
    check_checkpoint(tmp_path / "checkpoints" / "best", chosen["step"])
    assert all(m["grading_timeouts"] == 0 for m in train_rows(trainer.metrics))


def test_mean_dim_divides_the_gaussian_term_by_d(base, toy_rows, tmp_path):
    """The ablation knob reaches the trainer: the Gaussian term is scaled by 1/d of the base's E."""
    trainer = Trainer(TrainConfig.paper(**{**CFG, "gaussian_normalization": "mean_dim"}), str(base / "model"),
                      toy_rows["train"], toy_rows["validation"], tmp_path / "_resume")
    assert trainer.gaussian_scale == pytest.approx(1.0 / trainer.scale.dim)
    assert Trainer(TrainConfig.paper(**CFG), str(base / "model"), toy_rows["train"], toy_rows["validation"],
                   tmp_path / "_resume2").gaussian_scale == 1.0


@pytest.mark.slow
def test_sigma_of_a_trained_checkpoint_comes_from_its_base(base, toy_rows, tmp_path):
    """The rule training, validation and evaluation share (model.scale.noise_scale): sigma is set by
    the base model's E, so a trained model is tested at the noise level it was trained with."""
    from softtokens.eval.math_eval import evaluate
    from softtokens.model.loading import load_model
    from softtokens.model.scale import embedding_scale, noise_scale

    trainer = run_in_process(base, toy_rows, tmp_path, TrainConfig.paper(**{**CFG, "lr": 1e-2}))
    ckpt = tmp_path / "checkpoints" / "best"
    own = embedding_scale(load_model(ckpt))
    base_scale, source = noise_scale(ckpt, None)
    assert source.startswith("base model's E") and base_scale.as_dict() == trainer.embedding_scale
    assert own.rms_coordinate != pytest.approx(base_scale.rms_coordinate, rel=1e-4)  # E has moved in training
    result = evaluate(str(ckpt), toy_rows["test"][:2], "soft_sample", 2, 6, 2, 4, seed=0)
    assert result["sigma"] == pytest.approx(trainer.sigma) and result["sigma_source"] == source
    base_result = evaluate(str(base / "model"), toy_rows["test"][:2], "soft_sample", 2, 6, 2, 4, seed=0)
    assert base_result["sigma"] == pytest.approx(trainer.sigma) and base_result["sigma_source"] == "this base model's E"


@pytest.mark.slow
def test_one_source_of_cot_settings_for_training_validation_and_evaluation(base, toy_rows):
    """soft_temperature (and every CoT key) reaches training rollouts, greedy validation and the
    test-time settings alike: an ablation over tau evaluates at its own tau."""
    from softtokens.engine.settings import (
        INFERENCE_SETTINGS,
        PAPER_COT,
        CotSetting,
        cot_settings,
    )
    from softtokens.eval.math_eval import evaluate
    from softtokens.config.names import COT_KEYS

    assert INFERENCE_SETTINGS == cot_settings(PAPER_COT)
    assert INFERENCE_SETTINGS["soft_sample"] == CotSetting("soft", 0.5, 0.33)  # the paper's Section 4
    assert INFERENCE_SETTINGS["fuzzy_greedy"] == CotSetting("fuzzy", 0.0001, 0.0)
    cot = {**PAPER_COT, "soft_temperature": 0.7, "noise_factor": 1.0}
    six = cot_settings(cot)
    assert six["soft_greedy"] == CotSetting("soft", 0.7, 0.0) and six["soft_sample"] == CotSetting("soft", 0.7, 1.0)
    assert six["fuzzy_sample"] == CotSetting("fuzzy", 0.0001, 1.0) and six["hard_greedy"] == CotSetting("hard", 0.0, 0.0)
    for mode in ("hard", "soft", "fuzzy"):
        cfg = TrainConfig.paper(**{**CFG, **cot, "mode": mode})
        assert cfg.cot_setting == six[f"{mode}_sample"] and cfg.validation_setting == six[f"{mode}_greedy"]
    with pytest.raises(KeyError, match="missing soft_temperature"):
        cot_settings({k: v for k, v in PAPER_COT.items() if k != "soft_temperature"})
    assert set(COT_KEYS) == set(PAPER_COT)

    rows = toy_rows["test"][:2]
    result = evaluate(str(base / "model"), rows, "soft_greedy", 2, 6, 2, 4, seed=0, cot=cot)
    assert (result["temperature"], result["noise_factor"]) == (0.7, 0.0)
    result = evaluate(str(base / "model"), rows, "soft_sample", 2, 6, 2, 4, seed=0, cot=cot)
    assert (result["temperature"], result["noise_factor"]) == (0.7, 1.0)
    assert evaluate(str(base / "model"), rows, "soft_greedy", 2, 6, 2, 4, seed=0)["temperature"] == 0.5


@pytest.mark.slow
def test_relative_clipping_bounds_each_step_by_the_median_of_the_previous_norms(base, toy_rows, tmp_path, monkeypatch):
    """max_grad_norm_ratio k clips a step's gradient to k x the median norm (before clipping) of the
    previous grad_norm_window steps, once GRAD_NORM_HISTORY_MIN exist; a resumed run clips as an
    unbroken one (the history is its metrics), and clipping changes the run (docs/findings.md, "Why fuzzy
    training spikes")."""
    import statistics

    from softtokens.reward.grader import Grade
    from softtokens.train.clipping import GRAD_NORM_HISTORY_MIN

    # the untrained tiny base never boxes an answer, so every reward ties and no step has a gradient:
    # a grader that pays for completions of even length (deterministic) gives every step one
    even = lambda completion, gold, timeout: Grade(True, len(completion) % 2 == 0)  # noqa: E731
    settings = {**CFG, "mode": "fuzzy", "lr": 1e-5, "prompts_per_step": 4, "steps": 8, "val_every": 100,
                "max_grad_norm_ratio": 0.5, "grad_norm_window": 3}
    cfg = TrainConfig.paper(**settings)
    straight = train_rows(run_in_process(base, toy_rows, tmp_path / "straight", cfg, grader=even).metrics)
    for i, m in enumerate(straight):
        history = [p["grad_norm"] for p in straight[:i] if p["grad_norm"] > 0][-3:]  # steps with a gradient
        if len(history) < min(GRAD_NORM_HISTORY_MIN, 3):
            assert m["grad_clip"] is None and not m["clipped"]
        else:
            assert m["grad_clip"] == pytest.approx(0.5 * statistics.median(history))
            assert m["clipped"] == (m["grad_norm"] > m["grad_clip"])
    assert any(m["clipped"] for m in straight)
    assert all(m["jacobian_max"] >= 0 and m["near_ties"] >= 0 for m in straight)

    run_in_process(base, toy_rows, tmp_path / "resumed", cfg, crash_at=6, grader=even)
    resumed = train_rows(run_in_process(base, toy_rows, tmp_path / "resumed", cfg, grader=even).metrics)
    for x, y in zip(straight, resumed):
        assert (x["grad_clip"] is None) == (y["grad_clip"] is None)
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-5)
        if x["grad_clip"] is not None:
            assert x["grad_clip"] == pytest.approx(y["grad_clip"], rel=1e-5)

    unclipped = train_rows(run_in_process(base, toy_rows, tmp_path / "unclipped",
                                          TrainConfig.paper(**{**settings, "max_grad_norm_ratio": 0.0}), grader=even).metrics)
    assert all(m["grad_clip"] is None for m in unclipped)
    first = next(i for i, m in enumerate(straight) if m["clipped"])
    assert straight[first]["grad_norm"] == pytest.approx(unclipped[first]["grad_norm"], rel=1e-5)  # same until then
    # a clipped step moves the weights otherwise than the same step unclipped
    from safetensors.torch import load_file

    clipped_w = load_file(tmp_path / "straight" / "checkpoints" / "latest" / "model.safetensors")
    unclipped_w = load_file(tmp_path / "unclipped" / "checkpoints" / "latest" / "model.safetensors")
    assert any(not torch.equal(clipped_w[k], unclipped_w[k]) for k in clipped_w)


def test_steps_without_a_gradient_are_not_part_of_the_clipping_history():
    """A step whose rewards all tied has a zero gradient; counting it would drag the median to 0 and
    clip the next real gradient away."""
    from softtokens.train.clipping import clip_threshold

    cfg = TrainConfig.paper(mode="fuzzy", seed=0, lr=1.0, max_grad_norm_ratio=2.0, grad_norm_window=4)
    history = lambda norms: [{"kind": "train", "grad_norm": x} for x in norms] + [{"kind": "validation", "step": 0}]  # noqa: E731
    assert clip_threshold(cfg, history([5.0, 0.0, 0.0, 0.0])) == float("inf")  # one step with a gradient
    assert clip_threshold(cfg, history([1.0, 0.0, 3.0, 9.0, 0.0, 5.0])) == pytest.approx(2.0 * 4.0)
    assert clip_threshold(cfg, history([1.0, 100.0, 3.0, 9.0, 5.0])) == pytest.approx(2.0 * 7.0)  # last 4
    both = TrainConfig.paper(mode="fuzzy", seed=0, lr=1.0, max_grad_norm=3.0, max_grad_norm_ratio=2.0,
                             grad_norm_window=4)
    assert clip_threshold(both, history([4.0] * 4)) == 3.0


def test_group_clipping_bounds_the_embedding_and_the_rest_each_by_its_own_history(base, toy_rows, tmp_path,
                                                                                 monkeypatch):
    """grad_clip_groups: embedding_rest: the ratio bounds E's gradient and the rest's each by k x the
    median of that group's own previous norms; the whole gradient's norm is logged before clipping."""
    import statistics

    from softtokens.reward.grader import Grade

    even = lambda completion, gold, timeout: Grade(True, len(completion) % 2 == 0)  # noqa: E731
    cfg = TrainConfig.paper(**{**CFG, "mode": "fuzzy", "lr": 1e-5, "prompts_per_step": 4, "steps": 8, "val_every": 100,
                         "max_grad_norm_ratio": 0.5, "grad_norm_window": 3, "grad_clip_groups": "embedding_rest"})
    rows = train_rows(run_in_process(base, toy_rows, tmp_path, cfg, grader=even).metrics)
    clipped_any = False
    for i, m in enumerate(rows):
        assert m["grad_clip"] is None  # the ratio is the groups'
        assert m["grad_norm"] == pytest.approx((m["grad_norm_embedding"] ** 2 + m["grad_norm_rest"] ** 2) ** 0.5, rel=1e-5)
        for g in ("embedding", "rest"):
            history = [p[f"grad_norm_{g}"] for p in rows[:i] if p[f"grad_norm_{g}"] > 0][-3:]
            if len(history) < 3:
                assert m[f"grad_clip_{g}"] is None
            else:
                assert m[f"grad_clip_{g}"] == pytest.approx(0.5 * statistics.median(history))
                clipped_any |= m[f"grad_norm_{g}"] > m[f"grad_clip_{g}"]
    assert clipped_any
