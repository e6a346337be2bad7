"""One run's resolved training settings (TrainConfig), the description of its noise that its
checkpoints and provenance record, and the learning-rate schedule.

TrainConfig has no defaults of its own: the paper's values live once, in the config schema
(softtokens.config.grids.PAPER_RL), and reach a run through the workflow's resolved settings.
A missing or an unknown key is refused, naming it, so a typo in a grid cannot silently train
with the paper's value instead."""

from __future__ import annotations

import math
from dataclasses import dataclass

from softtokens.engine.settings import CotSetting, Placement, cot_settings, placement_of
from softtokens.config.grids import PAPER_RL
from softtokens.config.names import COT_KEYS, setting_name

# steps whose float32 logits the update pass holds at once (train.rloo.rollout_log_probs; the memory
# plan counts them, without importing torch): at least LOGIT_CHUNK_STEPS, and at least LOGIT_CHUNK_TOKENS
# tokens of a micro-batch, so that a small micro-batch does not pay a chunk's fixed costs (the head's
# full-size weight gradient, one checkpointed call) every 64 steps of 2 rows
LOGIT_CHUNK_STEPS = 64
LOGIT_CHUNK_TOKENS = 1024


def resume_save_due(done: int, steps: int, val_every: int, resume_save_steps: int) -> tuple[bool, bool]:
    """(validate, save the resume state) after step ``done``: every validation step saves, and every
    resume_save_steps-th step. One rule for the loop (train.loop) and the forecast (cost.forecast), so the
    forecast counts the saves the loop makes (not a timer that restarts at every save)."""
    validate = done % val_every == 0 or done == steps
    return validate, validate or done % resume_save_steps == 0


def save_schedule(steps: int, val_every: int, resume_save_steps: int, improvements: int | None = None) -> dict:
    """How many saves of each kind a run of ``steps`` makes (resume_save_due): ``latest`` (the resume state; the
    last step's, ``final``, is its weights alone: no step follows it), ``best`` (at most one per validation of a
    trained step: written only when it improves; ``improvements``, where known, says how often it did),
    ``validations`` (the base's at step 0 included)."""
    latest = sum(resume_save_due(d, steps, val_every, resume_save_steps)[1] for d in range(1, steps + 1))
    validations = 1 + sum(resume_save_due(d, steps, val_every, resume_save_steps)[0] for d in range(1, steps + 1))
    return {"latest": latest, "final": int(steps > 0), "validations": validations,
            "best": validations - 1 if improvements is None else improvements}


# vocabulary rows per weight-gradient GEMM of the fused head (train.head_loss): the (V x d) float32 product of
# a float32 gradient is made a tile at a time into the running sum, so its transients (the GEMM's output over
# the operand and its bf16 remainder, and their sum: 3 x tile x d x 4 bytes, counted by sizing.plan) replace the
# (2V x d) + (V x d) a whole product made beside the sum (5.3 GB hard, 8.4 GB soft at V 128,256 x d 3,072)
HEAD_TILE_ROWS = 8192


def logit_chunk_steps(rows: int) -> int:
    """Steps per logit chunk of a micro-batch of ``rows`` rows."""
    return max(LOGIT_CHUNK_STEPS, LOGIT_CHUNK_TOKENS // max(1, rows))


@dataclass(frozen=True)
class TrainConfig:
    """One run's resolved settings: the run (mode, seed, lr, variant) and every key of the schema's
    ``rl`` (its descriptions say what each is)."""

    mode: str                          # hard | soft | fuzzy (config.names.MODES)
    seed: int
    lr: float                          # the model's (6e-6 Llama-3B, 3e-6 Llama-8B, 8e-6 Qwen-3B)
    variant: str                       # an ablation's name; "" for the paper's cells
    prompts_per_step: int              # B
    samples_per_prompt: int            # G
    steps: int
    reward_correct: float
    reward_boxed_wrong: float
    reward_no_box: float
    optimizer: str
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    weight_decay: float
    lr_schedule: str
    warmup_steps: int
    max_grad_norm: float               # 0 = no clipping
    max_grad_norm_ratio: float         # k > 0: clip to k x the median norm of the previous grad_norm_window steps
    grad_norm_window: int
    grad_clip_groups: str              # "embedding_rest": the ratio bounds E and the rest each by its own history
    cot_max_tokens: int
    answer_max_tokens: int
    hard_temperature: float            # the CoT keys (config.names.COT_KEYS)
    soft_temperature: float
    fuzzy_temperature: float
    noise_factor: float                # gamma
    noise_placement: str               # embedding (the paper's) | hidden | logits (engine.settings.Placement)
    noise_top_k: int                   # logits placement: noise on the k largest logits, the rest -inf
    answer_temperature: float
    val_every: int
    val_size: int
    val_batch_size: int                # rows decoded at once in greedy validation (the memory plan's choice)
    validation_cot_max_tokens: int     # the CoT cap of greedy validation (config.grids.validation_cot_cap: a reading)
    micro_batch_size: int
    param_dtype: str                   # master weights, their gradients and AdamW state
    compute_dtype: str                 # forward / backward of the update pass and the rollout weights
    activation_checkpointing: bool     # recompute each decoder layer in the backward (memory)
    replay_h0_gap_max: float           # stop above (docs/engine.md, "Replay consistency")
    replay_argmax_mismatch_max: float
    replay_logit_tolerance: float      # nats; a flip within it is bf16 noise, not a mismatch
    gaussian_normalization: str        # "sum": the paper's log-density; "mean_dim": divided by d
    resume_save_steps: int             # also save the resume state after every this many steps (1: every step)
    grading_timeout_s: float           # per graded answer; past it the answer is wrong

    @classmethod
    def from_settings(cls, settings: dict) -> "TrainConfig":
        """From a run's resolved settings (softtokens.grid.jobs): every key, no other."""
        known = set(cls.__dataclass_fields__)
        settings = {"variant": "", **settings}
        unknown = sorted(set(settings) - known)
        if unknown:
            hint = (" ('dtype' was split into 'param_dtype' and 'compute_dtype')" if "dtype" in unknown else "")
            raise ValueError(f"unknown training settings: {', '.join(unknown)}{hint}")
        if settings.get("validation_cot_max_tokens") == "training":   # the run's own cap; `evaluation` the workflow's
            settings["validation_cot_max_tokens"] = settings.get("cot_max_tokens")
        if settings.get("validation_cot_max_tokens") == "evaluation":
            raise ValueError("validation_cot_max_tokens: evaluation is the grid's evaluation cap, which the workflow "
                             "resolves (config.grids.validation_cot_cap); a run is given the number")
        auto = [k for k in ("micro_batch_size", "activation_checkpointing", "val_batch_size")
                if settings.get(k) == "auto"]
        if auto:
            raise ValueError(f"{', '.join(auto)}: auto is chosen by the memory plan when the workflow resolves a run's "
                             "settings (sizing.plan.resolve_memory); a run is given the number")
        missing = sorted(known - set(settings))
        if missing:
            raise ValueError(f"training settings lack {', '.join(missing)} (the workflow resolves every key of "
                             "the schema's rl: softtokens.config.grids.PAPER_RL)")
        return cls(**settings)

    @classmethod
    def paper(cls, mode: str, seed: int, lr: float, **overrides) -> "TrainConfig":
        """The paper's settings (the schema's defaults) for one run, with ``overrides``."""
        return cls.from_settings({**PAPER_RL, "mode": mode, "seed": seed, "lr": lr, **overrides})

    @property
    def cot_setting(self) -> CotSetting:
        """The CoT decoding of training rollouts: the mode's *_sample inference setting."""
        return cot_settings({k: getattr(self, k) for k in COT_KEYS})[setting_name(self.mode, "sample")]

    @property
    def placement(self) -> Placement:
        """Where a soft / fuzzy rollout's noise goes; greedy validation uses it too (top-k keeps its
        restriction without noise)."""
        return placement_of({"noise_placement": self.noise_placement, "noise_top_k": self.noise_top_k})

    @property
    def validation_setting(self) -> CotSetting:
        """Greedy validation: the mode's *_greedy setting (hard CoT at tau = 0, or the run's
        soft/fuzzy CoT without noise)."""
        return cot_settings({k: getattr(self, k) for k in COT_KEYS})[setting_name(self.mode, "greedy")]


NOISED = {"embedding": "the next input h~ = softmax(logits / tau) @ E + sigma eps",
          "hidden": "the final hidden state h before the output head; the next input is softmax(W h~ / tau) @ E",
          "logits": "the logits before the softmax at tau; the next input is softmax(logits~ / tau) @ E"}


SIGMA_RULE = {"embedding": "gamma x RMS coordinate of the base model's E",
              "hidden": "gamma x RMS of the base model's final norm weight (a normed hidden state's RMS)",
              "logits": "gamma x RMS(final norm weight) x sqrt(d) x RMS coordinate of the output head W"}


def noise_record(cfg: TrainConfig, scale, sigma: float, vocab_rows: int) -> dict:
    """What a run's Gaussian noise is, for its checkpoints and provenance (docs/ablations.md):
    what is noised, sigma and its rule, and the density in the loss."""
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
