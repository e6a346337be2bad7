"""RLOO training of one (model, dataset, mode, seed) run (Section 4 and Appendix A).

One step: B prompts x G rollouts in the run's CoT mode -> rewards -> leave-one-out
advantages -> one teacher-forced pass per micro-batch -> AdamW step. Greedy validation every
``val_every`` steps picks the ``best`` checkpoint among trained steps (>= 1); the base model is
validated at step 0 too, as the reference a trained checkpoint is compared with, never as a
candidate (the paper tests "the best performing [model] under our greedy validation" of a run).

Resume state (``latest``, ``best`` so far, metrics so far) lives in ``state_dir``, which the
workflow does not declare as an output: Snakemake deletes declared outputs of a failed job,
and a preempted 4k-step run must not lose its progress. On success the checkpoints are
moved into the declared ``checkpoints/`` directory and the state directory is removed.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import socket
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from softtokens.config import COT_KEYS
from softtokens.data import format_prompt
from softtokens.distributed import DataParallel
from softtokens.grading import GradingPool
from softtokens.generation import (EMBEDDING, PAPER_COT, CotEngine, CotSetting, Placement, cot_settings, placement_of,
                                   row_seed)
from softtokens.modeling import EmbeddingScale, hub_revision, load_model, load_tokenizer, noise_scale
from softtokens.provenance import atomic_dir, write_jsonl
from softtokens.rewards import GRADING_TIMEOUT_S, grade, reward_of_grade
from softtokens.rloo import rloo_advantages, rloo_loss
from softtokens.sharding import (load_optimizer, recover_dir, refresh_rollout_weights, replace_dir,
                                 rollout_copy, save_optimizer, save_pretrained_consolidated, shard_policy)

# Replay consistency bounds (README, "Replay consistency"): measured in bf16 on CPU, with margin.
REPLAY_RESIDUAL_MAX = 1.5
REPLAY_ARGMAX_MISMATCH_MAX = 0.05
# a replayed argmax that differs from the rollout's counts as a mismatch only when the replay puts the
# rollout's token this many nats below its own top: bf16 flips near ties (docs/gpu.md, measured on an H100)
REPLAY_LOGIT_TOLERANCE = 1.0


class ReplayMismatch(RuntimeError):
    """The update pass does not see the rollout it is meant to score."""


class NonFiniteUpdate(RuntimeError):
    """A step's loss or gradient is NaN or infinite: the update is not applied."""


class Interrupted(RuntimeError):
    """SIGTERM / SIGUSR1 (SLURM's time-limit warning, a preemption, scancel): the resume state was
    saved and the job exits non-zero, so Snakemake's retry or SLURM's requeue resumes it."""


STOP_SIGNALS = ("SIGTERM", "SIGUSR1")
GRAD_NORM_HISTORY_MIN = 5  # steps of gradient norms before max_grad_norm_ratio clips


@dataclass(frozen=True)
class TrainConfig:
    """One run's resolved settings; defaults are the paper's (Section 4, Appendices A, C, D)."""

    mode: str                          # hard | soft | fuzzy
    seed: int
    lr: float                          # 6e-6 Llama-3B, 3e-6 Llama-8B, 8e-6 Qwen-3B
    prompts_per_step: int = 2          # B
    samples_per_prompt: int = 32       # G
    steps: int = 4000
    reward_correct: float = 100.0
    reward_boxed_wrong: float = 10.0
    reward_no_box: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    lr_schedule: str = "cosine"
    warmup_steps: int = 20
    max_grad_norm: float = 0.0         # 0 = no clipping
    max_grad_norm_ratio: float = 0.0   # k > 0: clip to k x the median norm of the previous grad_norm_window steps
    grad_norm_window: int = 50
    grad_clip_groups: str = "global"   # "embedding_rest": the ratio bounds E and the rest each by its own history
    cot_max_tokens: int = 128
    answer_max_tokens: int = 32
    hard_temperature: float = PAPER_COT["hard_temperature"]    # the CoT keys (config.COT_KEYS):
    soft_temperature: float = PAPER_COT["soft_temperature"]    # the paper's values, from one place
    fuzzy_temperature: float = PAPER_COT["fuzzy_temperature"]
    noise_factor: float = PAPER_COT["noise_factor"]            # gamma
    noise_placement: str = "embedding"  # embedding (the paper's) | hidden | logits (generation.Placement)
    noise_top_k: int = 0                # logits placement: noise on the k largest logits, the rest -inf
    answer_temperature: float = 1.0
    val_every: int = 50
    val_size: int = 500
    micro_batch_size: int = 8
    param_dtype: str = "float32"       # master weights, their gradients and AdamW state
    compute_dtype: str = "bfloat16"    # forward / backward of the update pass and the rollout weights
    activation_checkpointing: bool = False  # recompute each decoder layer in the backward (memory)
    optimizer: str = "adamw"
    gaussian_normalization: str = "sum"  # "sum": the paper's log-density; "mean_dim": divided by d
    grading_timeout_s: float = GRADING_TIMEOUT_S  # per graded answer; past it the answer is wrong
    resume_save_minutes: float = 10.0  # also save the resume state this often (0: after every step)
    replay_residual_max: float = REPLAY_RESIDUAL_MAX      # stop above (README, "Replay consistency")
    replay_argmax_mismatch_max: float = REPLAY_ARGMAX_MISMATCH_MAX
    replay_logit_tolerance: float = REPLAY_LOGIT_TOLERANCE  # nats; a flip within it is bf16 noise, not a mismatch

    @classmethod
    def from_settings(cls, settings: dict) -> "TrainConfig":
        if "dtype" in settings:
            raise ValueError("'dtype' was split into 'param_dtype' (master weights, float32) and 'compute_dtype' "
                             "(forward/backward and rollouts: bfloat16 on GPU); set those instead")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in settings.items() if k in known})

    @property
    def cot_setting(self) -> CotSetting:
        """The CoT decoding of training rollouts: the mode's *_sample inference setting."""
        return cot_settings({k: getattr(self, k) for k in COT_KEYS})[f"{self.mode}_sample"]

    @property
    def placement(self) -> Placement:
        """Where a soft / fuzzy rollout's noise goes; greedy validation uses it too (top-k keeps its
        restriction without noise)."""
        return placement_of({"noise_placement": self.noise_placement, "noise_top_k": self.noise_top_k})

    @property
    def validation_setting(self) -> CotSetting:
        """Greedy validation: the mode's *_greedy setting (hard CoT at tau = 0, or the run's
        soft/fuzzy CoT without noise)."""
        return cot_settings({k: getattr(self, k) for k in COT_KEYS})[f"{self.mode}_greedy"]



NOISED = {"embedding": "the next input h~ = softmax(logits / tau) @ E + sigma eps",
          "hidden": "the final hidden state h before the output head; the next input is softmax(W h~ / tau) @ E",
          "logits": "the logits before the softmax at tau; the next input is softmax(logits~ / tau) @ E"}
SIGMA_RULE = {"embedding": "gamma x RMS coordinate of the base model's E",
              "hidden": "gamma x RMS of the base model's final norm weight (a normed hidden state's RMS)",
              "logits": "gamma x RMS(final norm weight) x sqrt(d) x RMS coordinate of the output head W"}


def noise_record(cfg: TrainConfig, scale, sigma: float, vocab_rows: int) -> dict:
    """What a run's Gaussian noise is, for its checkpoints and provenance (README, "Noise
    placements"): what is noised, sigma and its rule, and the density in the loss."""
    where, k = cfg.placement
    if cfg.mode == "hard":
        return {"placement": None, "dims": 1, "density": "token log-probability at the hard temperature"}
    dims = {"embedding": scale.dim, "hidden": scale.dim, "logits": k or vocab_rows}[where]
    noised = NOISED[where] + (f"; only the {k} largest logits are kept and noised, the rest -inf" if k else "")
    return {"placement": where, "top_k": k, "noised": noised, "sigma": sigma, "sigma_rule": SIGMA_RULE[where],
            "gamma": cfg.noise_factor, "dims": dims,
            "density": f"log N(noised; replayed mean, sigma^2 I_{dims}) = -||noised - mean||^2 / (2 sigma^2)"
                       + ("" if cfg.gaussian_normalization == "sum" else f", divided by {dims}")}


def lr_lambda(cfg: TrainConfig):
    def f(step: int) -> float:
        warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps > 0 else 1.0
        if cfg.lr_schedule == "constant":
            return warm
        progress = min(1.0, max(0, step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
        return warm * 0.5 * (1.0 + math.cos(math.pi * progress))
    return f


def grade_in_process(pairs: list[tuple[str, str]], timeout_s: float = GRADING_TIMEOUT_S) -> list:
    """Grades one after the other in this process (SIGALRM budget only): the toy base's check."""
    return [grade(c, g, timeout_s) for c, g in pairs]


@torch.no_grad()
def greedy_correct(engine: CotEngine, rows: list[dict], setting: CotSetting, cot_max: int,
                   answer_max: int, batch_size: int = 256, timeout_s: float = GRADING_TIMEOUT_S,
                   placement: Placement = EMBEDDING, grade_all=None) -> int:
    """Number of rows answered correctly with a noise-free CoT and a greedy answer (the paper's
    greedy validation: no Gaussian noise, so sigma plays no part). ``grade_all(pairs)`` grades
    (completion, gold) pairs: a grading pool's in a training run."""
    prompts = [format_prompt(r["question"]) for r in rows]
    finished = engine.stream(prompts, [0] * len(rows), setting, 0.0, cot_max, answer_max, batch_size=batch_size,
                             placement=placement)
    pairs = [(row.completion, rows[row.job]["answer"]) for row in finished]
    graded = grade_all(pairs) if grade_all is not None else grade_in_process(pairs, timeout_s)
    return sum(g.correct for g in graded)


def greedy_accuracy(engine: CotEngine, rows: list[dict], setting: CotSetting, cot_max: int,
                    answer_max: int, batch_size: int = 256) -> float:
    return greedy_correct(engine, rows, setting, cot_max, answer_max, batch_size) / len(rows)


class Trainer:
    def __init__(self, cfg: TrainConfig, base_model: str, train_rows: list[dict], val_rows: list[dict],
                 state_dir: Path, threads: int = 1, grader=None, grading_pool: GradingPool | None = None):
        """``grader(completion, gold, timeout_s) -> Grade``: the paper's math-verify reward, graded in
        a pool of worker processes with a hard time-out (grading.py), unless a caller (gpu-check, on
        random weights that never answer right; tests) brings its own."""
        self.cfg, self.base_model, self.state_dir = cfg, base_model, Path(state_dir)
        self.grader = grader
        self.pool = None if grader is not None else (grading_pool or GradingPool(1, cfg.grading_timeout_s))
        self.train_rows, self.val_rows = train_rows, val_rows[: cfg.val_size]
        torch.set_num_threads(threads)
        torch.manual_seed(cfg.seed)
        self.dp = DataParallel()
        self.device = self.dp.device
        rows = cfg.prompts_per_step * cfg.samples_per_prompt
        if rows % self.dp.world:  # FSDP needs the same number of micro-batches on every process
            raise ValueError(f"B x G = {rows} rollout rows do not split evenly over {self.dp.world} processes")
        self.tokenizer = load_tokenizer(base_model)
        latest = self.state_dir / "latest"
        recover_dir(latest)
        recover_dir(self.state_dir / "best")
        self.start_step = 0
        self._discard_unusable_resume_state()
        resumed = (latest / "trainer_state.json").exists()
        state = json.loads((latest / "trainer_state.json").read_text()) if resumed else {}
        # master weights: every process reads the full model on CPU; FSDP keeps its shard on the device
        master = load_model(latest if resumed else base_model, cfg.param_dtype, "cpu")
        # the hub commit of the base weights (None for a local base), kept across resumes
        self.base_revision = state.get("base_revision") if resumed else hub_revision(master)
        # sigma comes from the base model's E, fixed for the run (modeling.noise_scale: the rule test
        # evaluation shares; greedy validation has no noise); recorded in checkpoints and provenance
        self.scale = EmbeddingScale(**state["embedding_scale"]) if resumed \
            else noise_scale(base_model, master, len(self.tokenizer))[0]
        self.embedding_scale = self.scale.as_dict()
        self.sigma = self.scale.sigma(cfg.cot_setting.noise_factor, cfg.placement.where)  # 0 for hard runs
        self.noise = noise_record(cfg, self.scale, self.sigma, len(self.tokenizer))
        self.rollout_model = rollout_copy(master, cfg.compute_dtype, self.device)
        self.engine = CotEngine(self.rollout_model, self.tokenizer)
        self.policy = shard_policy(master, self.dp.mesh, cfg.compute_dtype, cfg.param_dtype,
                                   cfg.activation_checkpointing)
        self.gaussian_scale = 1.0 / self.noise["dims"] if cfg.gaussian_normalization == "mean_dim" else 1.0
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                     eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(cfg))
        self.metrics: list[dict] = []
        self.stop_signal: str | None = None  # set by a STOP_SIGNALS handler (run)
        self.last_save = time.time()
        self.best_val = -1.0   # best greedy validation among trained steps (>= 1)
        self.base_val = None   # greedy validation of the base model (step 0)
        if resumed:
            load_optimizer(self.policy, self.opt, latest / "optimizer")
            self.sched.load_state_dict(torch.load(latest / "scheduler.pt", weights_only=True))
            self.start_step = state["step"]
            self.metrics = [m for m in _read_jsonl(self.state_dir / "metrics.jsonl") if m["step"] <= self.start_step]
            self.base_val = next((m["val_greedy_accuracy"] for m in self.metrics
                                  if m["kind"] == "validation" and m["step"] == 0), None)
            # the best trained step so far; state saved by a version that let step 0 be 'best' is ignored
            self.best_val = max((m["val_greedy_accuracy"] for m in self.metrics
                                 if m["kind"] == "validation" and m["step"] >= 1), default=-1.0)

    def _discard_unusable_resume_state(self) -> None:
        """A resume state with a missing, truncated or unreadable file is moved aside, never loaded:
        the run starts again from step 0 (it is deterministic, so it ends where it would have)."""
        problem = None
        if (self.state_dir / "latest").exists():
            problem = resume_state_problem(self.state_dir / "latest")
            best = self.state_dir / "best"
            if problem is None and best.exists():
                problem = resume_state_problem(best)
            elif problem is None and json.loads((self.state_dir / "latest" / "trainer_state.json").read_text()).get(
                    "best_val", -1.0) >= 0:
                problem = f"{best} is missing, but latest says a best checkpoint was saved"
        if problem is None:
            return
        self.dp.barrier()
        if self.dp.is_main:
            aside = self.state_dir.with_name(f"{self.state_dir.name}.unusable-{time.strftime('%Y%m%d-%H%M%S')}")
            shutil.move(str(self.state_dir), str(aside))
            print(f"WARNING: resume state not used ({problem}); moved to {aside}; starting again from step 0",
                  flush=True)
        self.dp.barrier()

    # ------------------------------------------------------------ one step
    def grade_all(self, pairs: list[tuple[str, str]]) -> list:
        """Grades of (completion, gold) pairs: the pool's, or the caller's grader."""
        if self.grader is not None:
            return [self.grader(c, g, self.cfg.grading_timeout_s) for c, g in pairs]
        return self.pool.grade_many(pairs)

    def close(self) -> None:
        """The grading workers and the process group."""
        if self.pool is not None:
            self.pool.close()
        self.dp.close()

    def prompts_for_step(self, step: int) -> list[dict]:
        rng = random.Random(row_seed(self.cfg.seed, step, -1))
        return rng.sample(self.train_rows, self.cfg.prompts_per_step)

    def rollouts(self, step: int):
        """This process's rollouts of a step, their grades, every row's reward and this process's
        advantages, and the global row count: the part of a step before the update pass."""
        cfg = self.cfg
        problems = self.prompts_for_step(step)
        prompts = [format_prompt(p["question"]) for p in problems for _ in range(cfg.samples_per_prompt)]
        seeds = [row_seed(cfg.seed, step, b, g) for b in range(cfg.prompts_per_step) for g in range(cfg.samples_per_prompt)]
        golds = [p["answer"] for p in problems for _ in range(cfg.samples_per_prompt)]
        n = len(prompts)
        mine = self.dp.shard(n)  # this process's rows (all of them with one process)
        rollout = self.engine.generate(prompts[mine], cfg.cot_setting, self.sigma, seeds[mine], cfg.cot_max_tokens,
                                       cfg.answer_max_tokens, cfg.answer_temperature, placement=cfg.placement)
        rollout_s = time.time()
        graded = self.grade_all(list(zip(rollout.completions, golds[mine])))
        my_rewards = torch.tensor([reward_of_grade(g, cfg.reward_correct, cfg.reward_boxed_wrong, cfg.reward_no_box)
                                   for g in graded], device=self.device)
        rewards = self.dp.gather_rows(my_rewards, n)  # the leave-one-out baseline needs all G of a prompt
        adv = rloo_advantages(rewards.view(cfg.prompts_per_step, cfg.samples_per_prompt)).flatten()[mine]
        return rollout, graded, rewards, adv, n, rollout_s

    def accumulate_gradients(self, rollout, adv: torch.Tensor, n: int) -> dict:
        """The update pass: the RLOO loss of this process's rows, micro-batch by micro-batch, into the
        gradients; returns its sums (this process's) for the step's metrics and checks."""
        cfg = self.cfg
        self.policy.train()
        sums = dict(loss=0.0, cot_lp=0.0, answer_lp=0.0, residual=0.0, mismatches=0, cot_steps=0, near_ties=0,
                    jacobian_max=0.0, flips=0, flip_gap_max=0.0, residual_steps=0)
        for start in range(0, len(adv), cfg.micro_batch_size):
            idx = slice(start, min(len(adv), start + cfg.micro_batch_size))
            replay = self.policy(rollout.rows(idx), self.sigma, cfg.answer_temperature, self.engine.vocab_rows,
                                 self.gaussian_scale, cfg.replay_logit_tolerance)
            loss = rloo_loss(replay.cot + replay.answer, adv[idx], n)  # divided by the global row count
            loss.backward()  # FSDP reduce-scatters in float32 into the float32 gradient shards
            sums["loss"] += loss.item()
            sums["cot_lp"] += replay.cot.detach().sum().item()
            sums["answer_lp"] += replay.answer.detach().sum().item()
            sums["residual"] += replay.residual_sum
            sums["mismatches"] += replay.argmax_mismatches
            sums["cot_steps"] += replay.cot_steps
            sums["near_ties"] += replay.near_ties
            sums["jacobian_max"] = max(sums["jacobian_max"], replay.jacobian_max)
            sums["flips"] += replay.argmax_flips
            sums["residual_steps"] += replay.residual_steps
            sums["flip_gap_max"] = max(sums["flip_gap_max"], replay.flip_gap_max)
        return sums

    def train_step(self, step: int) -> dict:
        cfg = self.cfg
        t0 = time.time()
        rollout, graded, rewards, adv, n, t1 = self.rollouts(step)
        t2 = time.time()
        sums = self.accumulate_gradients(rollout, adv, n)
        loss_sum, cot_lp_sum, ans_lp_sum = sums["loss"], sums["cot_lp"], sums["answer_lp"]
        residual_sum, mismatches, cot_steps = sums["residual"], sums["mismatches"], sums["cot_steps"]
        near_ties, jacobian_max = sums["near_ties"], sums["jacobian_max"]
        (residual_sum, mismatches, cot_steps, residual_steps) = self.dp.sum([residual_sum, mismatches, cot_steps,
                                                                             sums["residual_steps"]])
        replay_stats = self._check_replay(step, residual_sum, mismatches, cot_steps, residual_steps)  # before the update
        (near_ties, flips) = self.dp.sum([near_ties, sums["flips"]])
        (jacobian_max, flip_gap_max) = self.dp.max([jacobian_max, sums["flip_gap_max"]])
        replay_stats["replay_argmax_flips"] = flips / cot_steps if cot_steps else 0.0  # near ties included
        replay_stats["replay_flip_gap_max"] = flip_gap_max
        grad_norm, group_norms, bounds = self._clip_gradients()
        (total_loss,) = self.dp.sum([loss_sum])
        if not (math.isfinite(total_loss) and math.isfinite(_scalar(grad_norm))):
            self.opt.zero_grad(set_to_none=True)
            cause = "the loss" if not math.isfinite(total_loss) else "the gradient norm"
            raise NonFiniteUpdate(
                f"step {step + 1}: {cause} is not finite (loss {total_loss}, gradient norm {_scalar(grad_norm)}); "
                f"the update was not applied. The last good state is {self.state_dir / 'latest'} "
                f"(step {self._saved_step()}); see README, 'Reliability'.")
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        refresh_rollout_weights(self.policy, self.rollout_model)  # the next rollout sees this update
        t3 = time.time()

        r = rewards.view(cfg.prompts_per_step, cfg.samples_per_prompt)
        cot_mask = rollout.step_phase == 0
        (n_correct, n_boxed, n_timeouts, cot_len, n_stopped, ent_sum, ent_count, cot_lp_sum,
         ans_lp_sum) = self.dp.sum([sum(g.correct for g in graded), sum(g.boxed for g in graded),
                                    sum(g.timed_out for g in graded),
                                    rollout.cot_len.float().sum().item(), rollout.stopped.float().sum().item(),
                                    rollout.cot_entropy.sum().item(), cot_mask.sum().item(), cot_lp_sum, ans_lp_sum])
        loss_sum = total_loss  # summed over processes before the update
        return {
            "kind": "train", "step": step + 1,
            "reward": r.mean().item(), "reward_std": r.std(dim=1).mean().item(),
            "frac_correct": n_correct / n, "frac_boxed": n_boxed / n, "grading_timeouts": int(n_timeouts),
            "frac_reward_zero_std": (r.std(dim=1) == 0).float().mean().item(),
            "completions/mean_length": cot_len / n,
            "stop_rate": n_stopped / n,
            "entropy": ent_sum / max(1.0, ent_count),
            "loss": loss_sum, "cot_logp": cot_lp_sum / n, "answer_logp": ans_lp_sum / n,
            **replay_stats,
            "grad_norm": _scalar(grad_norm), "grad_clip": None if math.isinf(bounds["all"]) else bounds["all"],
            "clipped": bool(_scalar(grad_norm) > bounds["all"]),
            **{f"grad_norm_{g}": n for g, n in group_norms.items()},
            **{f"grad_clip_{g}": None if math.isinf(b) else b for g, b in bounds.items() if g != "all"},
            "near_ties": int(near_ties), "jacobian_max": jacobian_max,
            "lr": self.sched.get_last_lr()[0],
            "seconds_rollout": round(t1 - t0, 3), "seconds_reward": round(t2 - t1, 3),
            "seconds_update": round(t3 - t2, 3),
        }

    def _clip_gradients(self) -> tuple[torch.Tensor, dict[str, float], dict[str, float]]:
        """Clip the accumulated gradients; return the whole norm before clipping, the norm of each
        group (the input embedding E, the rest) before clipping, and the bounds applied ("all": the
        whole gradient's). With grad_clip_groups: embedding_rest, max_grad_norm_ratio bounds each
        group by its own history instead of the whole: fuzzy spikes land on the rest, whose usual
        norm is ~1 % of E's (README, "Why fuzzy training spikes")."""
        cfg = self.cfg
        params = list(self.policy.parameters())
        emb = self.policy.lm.get_input_embeddings().weight
        groups = {"embedding": [emb], "rest": [p for p in params if p is not emb]}
        by_group = cfg.grad_clip_groups == "embedding_rest"
        bounds, norms = {}, {}
        for name, ps in groups.items():
            bound = self.clip_threshold(f"grad_norm_{name}", absolute=False) if by_group else float("inf")
            norms[name] = _scalar(torch.nn.utils.clip_grad_norm_(ps, bound))  # an infinite bound leaves it as is
            if by_group:
                bounds[name] = bound
        # the whole gradient: max_grad_norm, and the ratio too unless the groups took it
        bounds["all"] = self.clip_threshold("grad_norm", with_ratio=not by_group)
        total = torch.nn.utils.clip_grad_norm_(params, bounds["all"])  # the whole norm (after any group clipping)
        if by_group:
            total = torch.tensor(math.sqrt(sum(n * n for n in norms.values())))  # before clipping
        return total, norms, bounds

    def clip_threshold(self, key: str = "grad_norm", with_ratio: bool = True, absolute: bool = True) -> float:
        """A gradient-norm bound: max_grad_norm (``absolute``), and max_grad_norm_ratio x the median
        of ``key`` (a norm before clipping) over the previous grad_norm_window steps with a gradient,
        once GRAD_NORM_HISTORY_MIN of them exist (or the window, if smaller).
        The history is the run's metrics, reloaded on resume, so a resumed run clips as an unbroken one."""
        cfg = self.cfg
        bounds = [cfg.max_grad_norm] if absolute and cfg.max_grad_norm > 0 else []
        if with_ratio and cfg.max_grad_norm_ratio > 0:
            # steps whose rewards all tied have no gradient: they are not part of the history
            past = [m[key] for m in self.metrics if m["kind"] == "train" and m.get(key, 0) > 0]
            past = past[-cfg.grad_norm_window:]
            if len(past) >= min(GRAD_NORM_HISTORY_MIN, cfg.grad_norm_window):
                bounds.append(cfg.max_grad_norm_ratio * statistics.median(past))
        return min(bounds, default=float("inf"))

    def _check_replay(self, step: int, residual_sum: float, mismatches: float, cot_steps: float,
                      residual_steps: float | None = None) -> dict:
        """Replay residual (soft/fuzzy: mean of ||h~ - h0_replay||^2 / (d sigma^2) over the CoT steps
        whose replayed argmax is the rollout's, ~1 when the teacher-forced replay reproduces the
        cached rollout) and the share of CoT steps whose rollout argmax the replay puts more than
        replay_logit_tolerance below its top; a run stops past the bounds."""
        cfg = self.cfg
        continuous = cfg.cot_setting.mode != "hard"
        steps = cot_steps if residual_steps is None else residual_steps
        residual = residual_sum / steps if continuous and steps else None
        mismatch = mismatches / cot_steps if cot_steps else 0.0
        problems = []
        if residual is not None and residual > cfg.replay_residual_max:
            problems.append(f"replay residual {residual:.4f} > replay_residual_max {cfg.replay_residual_max}")
        if mismatch > cfg.replay_argmax_mismatch_max:
            problems.append(f"argmax mismatch (the rollout's token > {cfg.replay_logit_tolerance} nats below the "
                            f"replay's top) {mismatch:.2%} of CoT steps > replay_argmax_mismatch_max "
                            f"{cfg.replay_argmax_mismatch_max:.2%}")
        if problems:
            raise ReplayMismatch(
                f"step {step + 1}: the update pass does not reproduce the rollout it scores ({'; '.join(problems)}; "
                f"compute_dtype {cfg.compute_dtype}, {int(cot_steps)} CoT steps). The gradient would not be the "
                "policy gradient of the rollouts: the step was not applied. See README, 'Replay consistency'.")
        return {"replay_residual": residual, "replay_argmax_mismatch": mismatch}

    # ------------------------------------------------------------ validation and checkpoints
    def validate(self, step: int) -> dict:
        mine = self.val_rows[self.dp.shard(len(self.val_rows))]
        correct = greedy_correct(self.engine, mine, self.cfg.validation_setting, self.cfg.cot_max_tokens,
                                 self.cfg.answer_max_tokens, timeout_s=self.cfg.grading_timeout_s,
                                 placement=self.cfg.placement, grade_all=self.grade_all)
        (correct,) = self.dp.sum([correct])
        return {"kind": "validation", "step": step, "val_greedy_accuracy": correct / len(self.val_rows)}

    def _save(self, name: str, step: int, with_optimizer: bool, extra: dict | None = None) -> None:
        """A consolidated ``save_pretrained`` directory of the master weights (loads with plain
        from_pretrained), and for resume the sharded AdamW state and the schedule. Every process
        takes part (the gathers are collective); the main process writes all but the optimizer
        shards, into a temporary directory that replaces ``name`` once complete."""
        final = self.state_dir / name
        tmp = self.state_dir / f".{name}.tmp"
        if self.dp.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.dp.barrier()
        save_pretrained_consolidated(self.policy, tmp, self.dp.is_main)
        if with_optimizer:
            save_optimizer(self.policy, self.opt, tmp / "optimizer")
        if self.dp.is_main:
            self.tokenizer.save_pretrained(tmp)
            state = {"step": step, "best_val": self.best_val, "base_val": self.base_val,
                     "embedding_scale": self.embedding_scale,
                     "sigma": self.sigma, "noise": self.noise, "config": asdict(self.cfg), "base_model": str(self.base_model),
                     "base_revision": self.base_revision, "processes": self.dp.world, **(extra or {})}
            if with_optimizer:
                torch.save(self.sched.state_dict(), tmp / "scheduler.pt")
            crash = os.environ.get("SOFTTOKENS_CRASH_IN_SAVE")  # fault injection: a crash mid-checkpoint
            if crash is not None and int(crash) == step and name == "latest":
                raise RuntimeError(f"injected crash while writing the {name} checkpoint of step {step}")
            # the size of every file, checked before a resume; trainer_state.json is written last, so a
            # checkpoint directory without it was never finished (resume_state_problem)
            state["files"] = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
            (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1))
            replace_dir(tmp, final)
        self.dp.barrier()
        self.last_save = time.time()

    def _saved_step(self) -> int:
        state = self.state_dir / "latest" / "trainer_state.json"
        return json.loads(state.read_text())["step"] if state.exists() else 0

    def _log(self, row: dict) -> None:
        self.metrics.append(row)
        if not self.dp.is_main:
            return
        with open(self.state_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")

    def _validate_and_keep_best(self, step: int) -> None:
        row = self.validate(step)
        self._log(row)
        if step == 0:  # the base model: the reference, not a candidate
            self.base_val = row["val_greedy_accuracy"]
            return
        if row["val_greedy_accuracy"] > self.best_val:
            self.best_val = row["val_greedy_accuracy"]
            self._save("best", step, with_optimizer=False, extra={"val_greedy_accuracy": self.best_val})

    @property
    def attempts_path(self) -> Path:
        """Beside the resume state, not in it: a damaged state moved aside, a finished run's state
        removed, a forced rerun from step 0 all keep counting the run's attempts."""
        return self.state_dir.parent / "attempts.jsonl"

    def attempts(self) -> list[dict]:
        """Every attempt of this run so far (this one last): job id, host, the step it resumed from."""
        return _read_jsonl(self.attempts_path)

    def _start_attempt(self) -> None:
        """One line per attempt in the log and in attempts.jsonl (kept in provenance)."""
        record = {"attempt": len(self.attempts()) + 1, "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                  "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT"), "host": socket.gethostname(),
                  "pid": os.getpid(), "resumed_from_step": self.start_step,
                  "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        if self.dp.is_main:
            with open(self.attempts_path, "a") as f:
                f.write(json.dumps(record) + "\n")
            start = f"resumed from step {self.start_step}" if self.start_step else "fresh start at step 0"
            print(f"=== attempt {record['attempt']}: job {record['slurm_job_id'] or '-'} on {record['host']} "
                  f"(pid {record['pid']}) at {record['started_at']}: {start}", flush=True)

    def _on_signal(self, signum, frame) -> None:
        self.stop_signal = signal.Signals(signum).name

    def run(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._start_attempt()
        if self.dp.is_main:
            write_jsonl(self.state_dir / "metrics.jsonl", self.metrics)  # drop rows past the resumed step
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            handlers = {name: signal.signal(getattr(signal, name), self._on_signal) for name in STOP_SIGNALS}
        try:
            self._run_steps()
        finally:
            for name, old in handlers.items():
                signal.signal(getattr(signal, name), old)

    def _run_steps(self) -> None:
        if self.start_step == 0:
            self._validate_and_keep_best(0)
        bar = tqdm(range(self.start_step, self.cfg.steps), desc=f"RLOO {self.cfg.mode} seed {self.cfg.seed}",
                   initial=self.start_step, total=self.cfg.steps, mininterval=5, disable=not self.dp.is_main)
        crash_at = os.environ.get("SOFTTOKENS_CRASH_AT_STEP")  # fault injection for the resume tests
        for step in bar:
            if crash_at is not None and step == int(crash_at):
                raise RuntimeError(f"injected crash before step {step + 1} (SOFTTOKENS_CRASH_AT_STEP)")
            row = self.train_step(step)
            self._log(row)
            bar.set_postfix(reward=f"{row['reward']:.1f}", acc=f"{row['frac_correct']:.2f}", best=f"{self.best_val:.3f}")
            done = step + 1
            # every process agrees on a signal or a due time-interval save (each may see its own)
            due = time.time() - self.last_save >= 60 * self.cfg.resume_save_minutes
            stop, due = (v > 0 for v in self.dp.sum([float(self.stop_signal is not None), float(due)]))
            if done % self.cfg.val_every == 0 or done == self.cfg.steps:
                self._validate_and_keep_best(done)
                self._save("latest", done, with_optimizer=True)
            elif due or stop:
                self._save("latest", done, with_optimizer=True)
            if stop and done < self.cfg.steps:
                raise Interrupted(f"{self.stop_signal or 'a stop signal'} received: resume state saved at step {done} "
                                  f"of {self.cfg.steps}; exiting so that the retry or requeue resumes from it")

    def finish(self, checkpoints_dir: Path, metrics_path: Path) -> None:
        """Move the final checkpoints into the declared outputs and drop the resume state."""
        if not self.dp.is_main:
            self.close()
            return
        checkpoints_dir = Path(checkpoints_dir)
        with atomic_dir(checkpoints_dir) as tmp:
            for name in ("best", "latest"):
                shutil.move(str(self.state_dir / name), str(tmp / name))
            shutil.rmtree(tmp / "latest" / "optimizer", ignore_errors=True)  # resume state only
            (tmp / "latest" / "scheduler.pt").unlink(missing_ok=True)
        write_jsonl(metrics_path, self.metrics)
        shutil.rmtree(self.state_dir)
        self.close()


def resume_state_problem(checkpoint: Path) -> str | None:
    """Why a saved checkpoint directory cannot be resumed from (None if it can): its
    trainer_state.json is missing or unreadable, or a file it lists is missing or has another size."""
    state_path = Path(checkpoint) / "trainer_state.json"
    try:
        state = json.loads(state_path.read_text())
    except FileNotFoundError:
        return f"{state_path} is missing"
    except (OSError, ValueError) as err:
        return f"{state_path} is unreadable ({type(err).__name__}: {err})"
    for name, size in state.get("files", {}).items():
        f = Path(checkpoint) / name
        if not f.is_file():
            return f"{f} is missing"
        if f.stat().st_size != size:
            return f"{f} has {f.stat().st_size} bytes, {size} were written"
    return None


def _scalar(t) -> float:
    """A float from a norm that may be a DTensor (FSDP)."""
    from torch.distributed.tensor import DTensor

    return float(t.full_tensor() if isinstance(t, DTensor) else t)


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
