"""RLOO training of one (model, dataset, mode, seed) run (Section 4 and Appendix A).

One step: B prompts x G rollouts in the run's CoT mode -> rewards -> leave-one-out
advantages -> one teacher-forced pass per micro-batch -> AdamW step. Greedy validation every
``val_every`` steps picks the ``best`` checkpoint among trained steps (>= 1); the base model is
validated at step 0 too, as the reference a trained checkpoint is compared with, never as a
candidate (the paper tests "the best performing [model] under our greedy validation" of a run).
Progress survives preemption through the run's resume state (train.resume)."""

from __future__ import annotations

import dataclasses
import math
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from softtokens.data.prompt import format_prompt
from softtokens.engine.cot import CotEngine
from softtokens.engine.sampling import row_seed
from softtokens.model.cpu_bf16 import bf16_products
from softtokens.model.checkpoint import TrainerState
from softtokens.model.loading import hub_revision, load_model, load_tokenizer
from softtokens.model.scale import EmbeddingScale, noise_scale
from softtokens.reward.grader import reward_of_grade
from softtokens.reward.pool import GradingPool, pool_size
from softtokens.train.clipping import clip_gradients
from softtokens.train.config import TrainConfig, lr_lambda, noise_record, resume_save_due
from softtokens.train.distributed import DataParallel
from softtokens.train.optimizer import adamw
from softtokens.train.resume import ResumeStore, StopSignals
from softtokens.train.saving import agree_on_failure
from softtokens.train.rloo import rloo_advantages
from softtokens.train.sharding import (
    refresh_rollout_weights,
    rollout_copy,
    shard_policy,
)
from softtokens.train.step_metrics import step_metrics
from softtokens.train.telemetry import Telemetry
from softtokens.train.update import NonFiniteUpdate, accumulate_gradients, check_replay
from softtokens.train.validation import greedy_validation


class Interrupted(RuntimeError):
    """SIGTERM / SIGUSR1 (SLURM's time-limit warning, a preemption, scancel): the resume state was
    saved and the job exits non-zero, so Snakemake's retry or SLURM's requeue resumes it."""


def validation_samples(cfg: TrainConfig, rows: list[dict], finished, graded, n: int) -> list[dict]:
    """The first ``n`` validation questions with the CoT, answer and reward the run gave them (telemetry)."""
    return [{"question": row["question"], "cot": out.cot_text, "answer": out.completion, "gold": row["answer"],
             "reward": reward_of_grade(g, cfg.reward_correct, cfg.reward_boxed_wrong, cfg.reward_no_box)}
            for row, out, g in list(zip(rows, finished, graded))[:n]]


class Trainer:
    def __init__(self, cfg: TrainConfig, base_model: str, train_rows: list[dict], val_rows: list[dict],
                 state_dir: Path, threads: int = 1, grader=None, grading_pool: GradingPool | None = None,
                 logging: dict | None = None, run_name: str = ""):
        """``grader(completion, gold, timeout_s) -> Grade``: the paper's reward, graded by worker processes (as many as
        the CPUs allow: reward.pool.pool_size) with a hard time-out, unless a caller (gpu-check on random weights,
        tests) brings its own. ``logging`` (the config's block) turns on the TensorBoard stream (train.telemetry)."""
        self.cfg, self.base_model, self.grader = cfg, base_model, grader
        self.pool = None if grader else grading_pool or GradingPool(pool_size(threads), cfg.grading_timeout_s)
        self.train_rows, self.val_rows = train_rows, val_rows[: cfg.val_size]
        torch.set_num_threads(threads)
        torch.manual_seed(cfg.seed)
        self.dp = DataParallel()
        self.device = self.dp.device
        rows = cfg.prompts_per_step * cfg.samples_per_prompt
        if rows % self.dp.world:  # FSDP needs the same number of micro-batches on every process
            raise ValueError(f"B x G = {rows} rollout rows do not split evenly over {self.dp.world} processes")
        self.tokenizer = load_tokenizer(base_model)
        self.store = ResumeStore(state_dir, self.dp)
        self.state_dir = self.store.dir
        saved = self.store.state()
        # master weights: every process reads the full model on CPU; FSDP keeps its shard on the device
        master = load_model(self.store.latest if saved else base_model, cfg.param_dtype, "cpu",
                            verified=bool(saved) and self.store.verified)
        self.base_revision = saved.base_revision if saved else hub_revision(master)  # kept across resumes
        # sigma comes from the base model's E, fixed for the run (model.scale.noise_scale, the rule test
        # evaluation shares; greedy validation has no noise)
        self.scale = EmbeddingScale(**saved.embedding_scale) if saved \
            else noise_scale(base_model, master, len(self.tokenizer))[0]
        self.embedding_scale = self.scale.as_dict()
        self.sigma = self.scale.sigma(cfg.cot_setting.noise_factor, cfg.placement.where)  # 0 for hard runs
        self.noise = noise_record(cfg, self.scale, self.sigma, len(self.tokenizer))
        self.gaussian_scale = 1.0 / self.noise["dims"] if cfg.gaussian_normalization == "mean_dim" else 1.0
        self.rollout_model = rollout_copy(master, cfg.compute_dtype, self.device)
        self.engine = CotEngine(self.rollout_model, self.tokenizer)
        self.policy = shard_policy(master, self.dp.mesh, cfg.compute_dtype, cfg.param_dtype,
                                   cfg.activation_checkpointing)
        self.opt, self.optimizer_kind = adamw(self.policy.parameters(), cfg.lr, (cfg.adam_beta1, cfg.adam_beta2),
                                              cfg.adam_eps, cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(cfg))
        self.start_step = saved.step if saved else 0
        self.metrics: list[dict] = self.store.metrics(self.start_step) if saved else []
        vals = {m["step"]: m["val_greedy_accuracy"] for m in self.metrics if m["kind"] == "validation"}
        self.base_val = vals.get(0)  # greedy validation of the base model (step 0)
        self.best_val = max((v for s, v in vals.items() if s >= 1), default=-1.0)  # among trained steps
        self.best_step = saved.best_step if saved else None  # the step the best checkpoint holds
        if saved and saved.step < cfg.steps:   # a save of the last step has no optimizer: nothing is left to do
            self.store.load_optimizer(self.policy, self.opt, self.sched)
        self.telemetry = Telemetry(self.store.tensorboard, run_name, logging or {}, dataclasses.asdict(cfg),
                                   self.start_step, enabled=logging is not None and self.dp.is_main)

    # ------------------------------------------------------------ one step
    def grade_all(self, pairs: list[tuple[str, str]]) -> list:
        """Grades of (completion, gold) pairs: the pool's, or the caller's grader."""
        if self.grader is not None:
            return [self.grader(c, g, self.cfg.grading_timeout_s) for c, g in pairs]
        return self.pool.grade_many(pairs)

    def prompts_for_step(self, step: int) -> list[dict]:
        rng = random.Random(row_seed(self.cfg.seed, step, -1))
        return rng.sample(self.train_rows, self.cfg.prompts_per_step)

    def rollouts(self, step: int):
        """This process's rollouts of a step, their grades, every row's reward, this process's
        advantages, the global row count and when grading began: the step before its update."""
        cfg, B, G = self.cfg, self.cfg.prompts_per_step, self.cfg.samples_per_prompt
        problems = self.prompts_for_step(step)
        prompts = [format_prompt(p["question"]) for p in problems for _ in range(G)]
        golds = [p["answer"] for p in problems for _ in range(G)]
        seeds = [row_seed(cfg.seed, step, b, g) for b in range(B) for g in range(G)]
        n = len(prompts)
        mine = self.dp.shard(n)  # this process's rows (all of them with one process)
        rollout = self.engine.generate(prompts[mine], cfg.cot_setting, self.sigma, seeds[mine], cfg.cot_max_tokens,
                                       cfg.answer_max_tokens, cfg.answer_temperature, placement=cfg.placement)
        graded_at = time.time()
        graded = self.grade_all(list(zip(rollout.completions, golds[mine])))
        my_rewards = torch.tensor([reward_of_grade(g, cfg.reward_correct, cfg.reward_boxed_wrong, cfg.reward_no_box)
                                   for g in graded], device=self.device)
        rewards = self.dp.gather_rows(my_rewards, n)  # the leave-one-out baseline needs all G of a prompt
        adv = rloo_advantages(rewards.view(B, G)).flatten()[mine]
        return rollout, graded, rewards, adv, n, graded_at

    def train_step(self, step: int) -> dict:
        t0 = time.time()
        rollout, graded, rewards, adv, n, t1 = self.rollouts(step)
        t2 = time.time()
        sums = accumulate_gradients(self.policy, rollout, adv, n, self.cfg, self.sigma, self.engine.vocab_rows,
                                    self.gaussian_scale).over(self.dp)
        replay = check_replay(self.cfg, step, sums)  # before the update
        clipped = clip_gradients(self.policy, self.cfg, self.metrics)
        self.apply_update(step, sums.loss, clipped.norm)
        seconds = {"rollout": t1 - t0, "reward": t2 - t1, "update": time.time() - t2}
        return step_metrics(step, self.cfg, rollout, graded, rewards, sums, replay, clipped, self.dp,
                            self.sched.get_last_lr()[0], seconds, self.sigma, self.noise["dims"])

    def apply_update(self, step: int, loss: float, grad_norm: float) -> None:
        """The AdamW step, unless the loss or the gradient is not finite; then the rollout copy."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.opt.zero_grad(set_to_none=True)
            cause = "the loss" if not math.isfinite(loss) else "the gradient norm"
            last = (f"The last good state is {self.store.latest} (step {self.store.saved_step()})"
                    if self.store.state() else "No state was saved yet: a rerun starts again from step 0")
            raise NonFiniteUpdate(
                f"step {step + 1}: {cause} is not finite (loss {loss}, gradient norm {grad_norm}); the update "
                f"was not applied. {last}; see docs/reliability.md.")
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        refresh_rollout_weights(self.policy, self.rollout_model)  # the next rollout sees this update

    # ------------------------------------------------------------ validation and checkpoints
    def validate(self, step: int) -> dict:
        cfg, mine = self.cfg, self.val_rows[self.dp.shard(len(self.val_rows))]
        finished, graded = greedy_validation(self.engine, mine, cfg.validation_setting, cfg.validation_cot_max_tokens,
                                             cfg.answer_max_tokens, cfg.val_batch_size, cfg.grading_timeout_s,
                                             cfg.placement, self.grade_all)
        # each question's outcome in the set's order ("1": right): a search compares values on the same questions
        outcomes = "".join(self.dp.gather_objects("".join("01"[g.correct] for g in graded)))
        self.telemetry.log_samples(validation_samples(cfg, mine, finished, graded, self.telemetry.samples), step)
        return {"kind": "validation", "step": step, "val_greedy_accuracy": outcomes.count("1") / len(self.val_rows),
                "val_correct": outcomes}

    def save(self, name: str, step: int, with_optimizer: bool, val_greedy_accuracy: float | None = None) -> None:
        state = TrainerState(step=step, best_val=self.best_val, base_val=self.base_val,
                             embedding_scale=self.embedding_scale, sigma=self.sigma, noise=self.noise,
                             config=dataclasses.asdict(self.cfg), base_model=str(self.base_model),
                             base_revision=self.base_revision, processes=self.dp.world,
                             val_greedy_accuracy=val_greedy_accuracy, best_step=self.best_step)
        optimizer = (self.opt, self.sched) if with_optimizer else (None, None)
        self.store.save(name, state, self.policy, self.tokenizer, *optimizer)
        self.telemetry.flush()  # what a watcher sees is at least what a resume would keep

    def log(self, row: dict) -> None:
        self.metrics.append(row)
        self.store.log(row)
        self.telemetry.log(row)

    def validate_and_keep_best(self, step: int) -> None:
        row = self.validate(step)
        self.log(row)
        if step == 0:  # the base model: the reference, not a candidate
            self.base_val = row["val_greedy_accuracy"]
        elif row["val_greedy_accuracy"] > self.best_val:
            self.best_val, self.best_step = row["val_greedy_accuracy"], step
            self.save("best", step, with_optimizer=False, val_greedy_accuracy=self.best_val)

    def attempts(self) -> list[dict]:
        return self.store.attempts()

    # ------------------------------------------------------------ the run
    def run(self) -> None:
        self.store.start_attempt(self.start_step)
        self.store.rewrite_metrics(self.metrics)
        if self.store.recovered:  # the newest save was damaged: what the run resumed from instead, in its metrics
            self.metrics.append({"kind": "resume", "step": self.start_step, **self.store.recovered})
            self.store.log(self.metrics[-1])
        # bf16 products in float32 on a CPU without bf16 units (model.cpu_bf16: the same arithmetic, its fast kernel)
        with StopSignals() as signals, self.store.settling(), bf16_products(self.cfg.compute_dtype, self.device):
            if self.start_step == 0:
                self.validate_and_keep_best(0)
            bar = tqdm(range(self.start_step, self.cfg.steps), desc=f"RLOO {self.cfg.mode} seed {self.cfg.seed}",
                       initial=self.start_step, total=self.cfg.steps, mininterval=5, disable=not self.dp.is_main)
            for step in bar:
                row = self.train_step(step)
                self.log(row)
                bar.set_postfix(reward=f"{row['reward']:.1f}", acc=f"{row['frac_correct']:.2f}",
                                best=f"{self.best_val:.3f}")
                self.after_step(step + 1, signals.received)

    def after_step(self, done: int, received: str | None) -> None:
        """Validate and save when due (train.config.resume_save_due: a count of steps, as the forecast counts); on
        a stop signal, save and stop. Every process agrees on a signal and on a failed save (each sees its own)."""
        validate, due = resume_save_due(done, self.cfg.steps, self.cfg.val_every, self.cfg.resume_save_steps)
        failure = self.store.failure()   # a background save of this process that failed: every process stops
        stop, failed = (v > 0 for v in self.dp.sum([float(received is not None), float(failure is not None)]))
        agree_on_failure(self.dp, failure, failed)
        if validate:
            self.validate_and_keep_best(done)
        if due or stop:   # the last step's: its weights only (finish drops a resume state no step follows)
            self.save("latest", done, with_optimizer=done < self.cfg.steps)
        if stop:
            self.store.wait()   # the save in flight complete before the process exits
        if stop and done < self.cfg.steps:
            raise Interrupted(f"{received or 'a stop signal'} received: resume state saved at step {done} of "
                              f"{self.cfg.steps}; exiting so that the retry or requeue resumes from it")

    def finish(self, checkpoints_dir: Path, metrics_path: Path, tensorboard_dir: Path | None = None) -> None:
        """Move the final checkpoints into the declared outputs and drop the resume state."""
        self.telemetry.close()
        self.store.wait()   # every process's part of the last saves written
        if self.dp.is_main:
            self.store.finish(Path(checkpoints_dir), metrics_path, self.metrics, tensorboard_dir)
        self.close()

    def close(self) -> None:
        """The telemetry, the grading workers and the process group."""
        self.telemetry.close()
        if self.pool is not None:
            self.pool.close()
        self.dp.close()
