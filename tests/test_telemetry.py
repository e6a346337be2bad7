"""A training run's TensorBoard stream (train.telemetry), read back with TensorBoard's own reader."""

import sys
import types

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_training import CFG

from softtokens.train.config import TrainConfig
from softtokens.train.loop import Trainer
from softtokens.train.telemetry import SAMPLES_TAG, TRAIN_TAGS, Mirror, scalars_of

ROW = {"kind": "train", "step": 5, "reward": 40.0, "reward_std": 3.0, "frac_reward_zero_std": 0.25,
       "frac_correct": 0.25, "frac_boxed": 0.75, "grading_timeouts": 1, "completions/mean_length": 12.0,
       "stop_rate": 0.8, "entropy": 0.0, "loss": 1.5, "grad_norm": 2.0, "lr": 1e-6, "replay_h0_gap": None, "replay_h0_gap_flipped": None,
       "replay_argmax_mismatch": 0.0, "replay_argmax_flips": 0.0, "noise_sigma": 0.0, "noise_expected_norm": 0.0,
       "completions/tokens": 300, "update_tokens": 500, "seconds_rollout": 2.0, "seconds_reward": 0.5,
       "seconds_update": 4.0}


def read_events(log_dir):
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_scalars_are_read_off_a_metrics_row_under_the_conventional_names():
    s = scalars_of(ROW)
    assert s["reward"] == 40.0 and s["learning_rate"] == 1e-6 and s["grad_norm"] == 2.0
    assert s["completions/clipped_ratio"] == pytest.approx(0.2)
    # the answer reward split 100 / 10 / 0 adds up to every row
    assert (s["reward/frac_100_correct"], s["reward/frac_10_boxed_wrong"], s["reward/frac_0_no_box"]) == (0.25, 0.5, 0.25)
    assert s["cot/effective_tokens"] == 1.0  # exp(0): a one-hot
    assert s["perf/rollout_tokens_per_s"] == 150.0 and s["perf/update_tokens_per_s"] == 125.0
    assert s["perf/step_time_s"] == 6.5
    assert "replay/residual" not in s  # hard runs have none: no point at all, not a zero
    assert scalars_of({"kind": "validation", "step": 0, "val_greedy_accuracy": 0.5}) == {"val/greedy_accuracy": 50.0}  # %, as the reward


@pytest.mark.slow
def test_a_resumed_run_streams_every_step_once_and_moves_its_events_into_the_output(base, toy_rows, tmp_path):
    cfg = TrainConfig.paper(**{**CFG, "val_every": 2, "steps": 4})
    out, logging = tmp_path / "run", {"backend": "none", "project": "p", "samples": 2}

    def trainer():
        return Trainer(cfg, str(base / "model"), toy_rows["train"], toy_rows["validation"], out / "_resume",
                       logging=logging, run_name="toy/run")
    first = trainer()
    real = first.train_step

    def crashing(step):  # step 3 logs its row, then step 4 crashes: the resume point is step 2
        if step == 3:
            raise RuntimeError("preempted")
        return real(step)
    first.train_step = crashing
    with pytest.raises(RuntimeError, match="preempted"):
        first.run()
    first.close()
    live = read_events(out / "_resume" / "tensorboard")  # watchable while the run is down
    assert [e.step for e in live.Scalars("reward")] == [1, 2, 3]

    second = trainer()
    assert second.start_step == 2
    second.run()
    second.finish(out / "checkpoints", out / "metrics.jsonl", out / "tensorboard")
    assert not (out / "_resume").exists()
    acc = read_events(out / "tensorboard")
    rows = [m for m in second.metrics if m["kind"] == "train"]
    assert [e.step for e in acc.Scalars("reward")] == [1, 2, 3, 4]  # step 3 ran twice, shows once
    assert [e.value for e in acc.Scalars("reward")] == pytest.approx([m["reward"] for m in rows])
    # every tag with a value in some step (replay/h0_gap_flipped only where an argmax flipped: never in float32)
    logged = {tag for tag, read in TRAIN_TAGS.items() if any(read(r) is not None for r in rows)}
    assert "replay/h0_gap" in logged or rows[0]["replay_h0_gap"] is None
    assert logged <= set(acc.Tags()["scalars"])
    assert acc.Scalars("noise/sigma")[0].value == pytest.approx(second.sigma) and second.sigma > 0
    assert [e.step for e in acc.Scalars("val/greedy_accuracy")] == [0, 2, 4]
    samples = acc.Tensors(f"{SAMPLES_TAG}/text_summary")
    assert [e.step for e in samples] == [0, 2, 4]
    text = samples[-1].tensor_proto.string_val[0].decode()
    assert text.count("\n") == 1 + 2 and "| question | CoT | answer | gold | reward |" in text


def test_wandb_or_trackio_receive_the_same_stream(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(
        init=lambda **kw: calls.append(("init", kw)), log=lambda d, step: calls.append(("log", d, step)),
        finish=lambda: calls.append(("finish",)), Table=lambda columns, data: ("table", columns, data))
    monkeypatch.setitem(sys.modules, "trackio", fake)
    mirror = Mirror("trackio", "proj", "toy/run", {"lr": 1})
    mirror.log(scalars_of(ROW), 5)
    mirror.table("val/samples", [{"question": "q", "cot": "c", "answer": "a", "gold": "g", "reward": 100}], 6)
    mirror.close()
    assert calls[0] == ("init", {"project": "proj", "name": "toy/run", "config": {"lr": 1}})
    assert calls[1] == ("log", scalars_of(ROW), 5)
    assert calls[2] == ("log", {"val/samples": ("table", ["question", "cot", "answer", "gold", "reward"],
                                                [["q", "c", "a", "g", 100]])}, 6)
    assert calls[3] == ("finish",)


def test_an_absent_backend_is_named_with_its_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails
    with pytest.raises(SystemExit, match="pip install wandb"):
        Mirror("wandb", "p", "r", {})
