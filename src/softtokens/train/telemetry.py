"""A training run's live telemetry: TensorBoard event files (always), mirrored to wandb or trackio
when ``logging.backend`` asks, under the names TRL and verl use, so that a researcher watches a
soft-token run with the tools they already have (``tensorboard --logdir results/<grid>/runs``).

Why beside ``metrics.jsonl`` and not instead of it: the JSON lines are what the workflow and the
report read (exact, one row per step); the event files are for watching. While a run trains they
live in its resume state (``_resume/tensorboard``, kept when a job fails); the finished run moves
them to its declared ``tensorboard/`` output. A resumed attempt purges the steps after its resume
point, so a step that ran twice shows once.

``TAGS`` is the one home of the tag names: each is read off a ``metrics.jsonl`` row
(``scalars_of``), so a curve and the row it came from cannot disagree.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from pathlib import Path


def _get(key: str) -> Callable[[dict], float | None]:
    return lambda row: row.get(key)


def _tokens_per_s(tokens_key: str, seconds_key: str) -> Callable[[dict], float | None]:
    def f(row: dict) -> float | None:
        tokens, seconds = row.get(tokens_key), row.get(seconds_key)
        return tokens / seconds if tokens is not None and seconds else None
    return f


# tag -> how it is read off a training step's metrics row (train.step_metrics)
TRAIN_TAGS: dict[str, Callable[[dict], float | None]] = {
    "reward": _get("reward"),
    "reward_std": _get("reward_std"),
    "frac_reward_zero_std": _get("frac_reward_zero_std"),
    # the answer reward split: 100 (correct), 10 (boxed, wrong), 0 (no box)
    "reward/frac_100_correct": _get("frac_correct"),
    "reward/frac_10_boxed_wrong": lambda r: r["frac_boxed"] - r["frac_correct"],
    "reward/frac_0_no_box": lambda r: 1.0 - r["frac_boxed"],
    "reward/grading_timeouts": _get("grading_timeouts"),
    "completions/mean_length": _get("completions/mean_length"),
    # CoTs that hit the token limit before the stop text
    "completions/clipped_ratio": lambda r: 1.0 - r["stop_rate"],
    # the entropy of the next-token distribution at CoT steps (nats), and exp of it: the effective
    # number of tokens a step weighs (a soft token's spread; 1 for a one-hot)
    "entropy": _get("entropy"),
    "cot/effective_tokens": lambda r: math.exp(r["entropy"]),
    "loss": _get("loss"),
    "grad_norm": _get("grad_norm"),
    "learning_rate": _get("lr"),
    # soft / fuzzy: how faithfully the update's replay reproduced the rollout (train.update.check_replay)
    "replay/h0_gap": _get("replay_h0_gap"),
    "replay/h0_gap_flipped": _get("replay_h0_gap_flipped"),
    "replay/argmax_mismatch": _get("replay_argmax_mismatch"),
    "replay/argmax_flips": _get("replay_argmax_flips"),
    "noise/sigma": _get("noise_sigma"),
    # E||n|| of the Gaussian added at a CoT step: sigma * sqrt(dims noised)
    "noise/expected_norm": _get("noise_expected_norm"),
    "perf/rollout_tokens_per_s": _tokens_per_s("completions/tokens", "seconds_rollout"),
    "perf/update_tokens_per_s": _tokens_per_s("update_tokens", "seconds_update"),
    "perf/step_time_s": lambda r: sum(r.get(f"seconds_{k}", 0.0) for k in ("rollout", "reward", "update")),
}
VALIDATION_TAGS: dict[str, Callable[[dict], float | None]] = {
    # in percent, as the tables print accuracies and on the reward's 0-100 scale (metrics.jsonl keeps the fraction)
    "val/greedy_accuracy": lambda r: None if r.get("val_greedy_accuracy") is None else 100.0 * r["val_greedy_accuracy"],
}
SAMPLES_TAG = "val/samples"


def scalars_of(row: dict) -> dict[str, float]:
    """The finite scalars a ``metrics.jsonl`` row streams, by tag."""
    tags = VALIDATION_TAGS if row.get("kind") == "validation" else TRAIN_TAGS
    out = {}
    for tag, read in tags.items():
        try:
            value = read(row)
        except (KeyError, TypeError):
            continue
        if value is not None and math.isfinite(float(value)):
            out[tag] = float(value)
    return out


def samples_markdown(samples: list[dict]) -> str:
    """Validation generations as a Markdown table (TensorBoard's text plugin renders it)."""
    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")[:400]
    lines = ["| question | CoT | answer | gold | reward |", "|---|---|---|---|---|"]
    lines += [f"| {cell(s['question'])} | {cell(s['cot'])} | {cell(s['answer'])} | {cell(s['gold'])} | "
              f"{s['reward']:g} |" for s in samples]
    return "\n".join(lines)


class Mirror:
    """wandb or trackio (the same ``init`` / ``log`` / ``finish`` calls), imported only when asked."""

    def __init__(self, backend: str, project: str, name: str, config: dict):
        try:
            self.lib = importlib.import_module(backend)
        except ImportError as err:
            raise SystemExit(f"config.yaml logging.backend is {backend!r} but {backend} is not installed "
                             f"(pip install {backend}), or set logging.backend: none") from err
        self.run = self.lib.init(project=project, name=name, config=config)

    def log(self, scalars: dict, step: int) -> None:
        self.lib.log(scalars, step=step)

    def table(self, tag: str, samples: list[dict], step: int) -> None:
        columns = ["question", "cot", "answer", "gold", "reward"]
        table = self.lib.Table(columns=columns, data=[[s[c] for c in columns] for s in samples])
        self.lib.log({tag: table}, step=step)

    def close(self) -> None:
        self.lib.finish()


class Telemetry:
    """One run's stream. ``logging``: the config's resolved ``logging`` block; only the main
    process of a distributed run writes (its rows are already the step's, summed over processes)."""

    def __init__(self, log_dir: Path, run_name: str, logging: dict, config: dict, resume_step: int = 0,
                 enabled: bool = True):
        self.writer = self.mirror = None
        self.samples = int(logging.get("samples", 0))
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed attempt hides the steps its predecessor logged after the resume point
        # (from step 0 when it starts again from the base: its step-0 validation runs again too)
        self.writer = SummaryWriter(str(log_dir), purge_step=resume_step + 1 if resume_step else 0)
        if logging.get("backend", "none") != "none":
            self.mirror = Mirror(logging["backend"], logging["project"], run_name, config)

    def log(self, row: dict) -> None:
        if self.writer is None:
            return
        scalars = scalars_of(row)
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, row["step"])
        if self.mirror is not None:
            self.mirror.log(scalars, row["step"])

    def log_samples(self, samples: list[dict], step: int) -> None:
        if self.writer is None or not samples:
            return
        self.writer.add_text(SAMPLES_TAG, samples_markdown(samples), step)
        if self.mirror is not None:
            self.mirror.table(SAMPLES_TAG, samples, step)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.mirror is not None:
            self.mirror.close()
            self.mirror = None
