"""The per-GPU memory plan of every training and evaluation job of a grid, from each model's
architecture numbers (shipped under ``architectures/``: no download), so that a grid whose
jobs cannot fit the GPU memory it declares stops before any job starts.

A training job's P processes each hold their FSDP2 shard (rank 0's, the largest) of the master weights, their
gradients and AdamW's two moments in ``param_dtype``, and the whole rollout copy in ``compute_dtype``; each phase
adds what it makes: the rollout its KV cache, decode transients and recorded float32 soft inputs; the update the
saved activations of a micro-batch and the head's peak (train.head_loss: a chunk's logits, W's float32 gradient
sum, the root gathered), the gradient shards where an earlier micro-batch made them; the optimizer step the AdamW
implementation's temporaries; greedy validation its own KV cache; a staged save one gathered tensor. Every term is
held to PyTorch's own accounting of the project's code (gpucheck.trace, `softtokens plan --trace`, within 5 % on
every paper job: docs/memory-plan.md, "The plan held to its trace"); parameters, gradients and optimizer state are
exact (tests compare them with what FSDP allocates on CPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from softtokens.data.prompt import PREFILL_TOKENS
from softtokens.config.grids import EVAL_DEFAULTS, cell_rl, resolved_rl
from softtokens.config.grids import train_processes
from softtokens.sizing.architecture import (  # noqa: F401  (the plan's public names: tests and gpu-check read them here)
    ARCHITECTURES,
    DECODER_DEFAULTS,
    Architecture,
    _from_config_json,
    _meta_architecture,
    architecture_file,
    load_architecture,
    toy_architecture,
)
from softtokens.train.config import logit_chunk_steps

GB = 1e9
BYTES = {"float32": 4, "bfloat16": 2, "float64": 8}
USABLE_SHARE = 0.9         # of a GPU's memory: CUDA context, NCCL buffers, allocator fragmentation
# the GPU jobs' torch multiplies bf16 matrices into float32 results in one GEMM (model.head.fused_wide_matmul:
# CUDA's torch.mm(..., out_dtype)), so no float32 copy of the vocabulary projection exists on a GPU
FUSED_WIDE_GEMM = True
# AdamW's implementations and the float32 temporaries of the sharded parameters' size each allocates in step()
# (train.optimizer chooses "fused" where the device has the kernels)
OPTIMIZER_TEMPORARIES = {"fused": 0, "foreach": 1}
# float32 values alive per logit of a chunk at the update head's peak (train.head_loss: logits, the mixture's split
# probabilities, terms, gradients), traced: 8.43 at llama-3b x math's 2,048-row chunk, 7.0-7.6 at micro-batches of 8;
# hard tokens (no mixture) untraced (a job's soft / fuzzy runs are its largest): the earlier count
HEAD_FLOATS_PER_LOGIT = 8.5
HARD_FLOATS_PER_LOGIT = 4


def sharded_bytes(arch: Architecture, processes: int, itemsize: int) -> int:
    """Bytes on the process holding the largest FSDP2 shard of every tensor (dim 0 in P chunks)."""
    return sum(-(-s[0] // processes) * math.prod(s[1:]) * itemsize for s in arch.shapes)


@dataclass(frozen=True)
class TrainJob:
    processes: int
    rows: int                   # B x G rollout rows of a step
    micro_batch: int
    prompt_tokens: int
    cot_tokens: int
    answer_tokens: int
    continuous: bool            # soft / fuzzy (recorded soft inputs, the mixture's copy of E)
    param_dtype: str = "float32"
    compute_dtype: str = "bfloat16"
    checkpointing: bool = False
    optimizer: str = "fused"    # train.optimizer's AdamW implementation (OPTIMIZER_TEMPORARIES)
    val_rows: int = 0           # rows a process decodes at once in greedy validation (0: its rollout rows)
    val_cot_tokens: int = 0     # greedy validation's CoT cap (0: the rollout's)
    group: int = 1              # rows that share a prompt (G): a prompt is prefilled once for its rows


def saved_per_token_layer(arch: Architecture, compute_bytes: int = 2) -> int:
    """Bytes a decoder layer saves per token for its backward (module docstring): 4d + 4 h hd + 4 I values in the
    compute dtype, and the float32 input of each of its two RMSNorms (4 bytes x 2d). The un-repeated K and V are
    not kept (attention keeps the repeated ones)."""
    a = arch
    return (4 * a.hidden + 4 * a.heads * a.head_dim + 4 * a.intermediate) * compute_bytes + 2 * a.hidden * 4


def prefilled_rows(rows: int, group: int) -> int:
    """Prompts a process prefills for ``rows`` rows of ``group`` to a prompt (DecodeRun.admit runs a repeated prompt
    once): a shard that does not start at a prompt's first row holds one more."""
    group = max(1, min(group, rows))
    return min(rows, -(-rows // group) + (1 if rows % group else 0))


def wide_copies(arch: Architecture, compute_dtype: str, continuous: bool) -> int:
    """float32 copies of the vocabulary projection (and of an untied E for the mixture) a head makes:
    none where the compute dtype is float32 already or bf16 GEMMs write float32 (FUSED_WIDE_GEMM)."""
    if BYTES[compute_dtype] >= 4 or FUSED_WIDE_GEMM:
        return 0
    return 1 + (continuous and not arch.tied)


def train_memory(arch: Architecture, job: TrainJob, first_step: bool = False) -> dict[str, float]:
    """Bytes per GPU of one training process, by component, by phase (held, rollout, backward,
    optimizer step, update) and the peak; ``first_step``: before AdamW has state (module docstring)."""
    a, P = arch, job.processes
    p, c = BYTES[job.param_dtype], BYTES[job.compute_dtype]
    steps = job.cot_tokens + PREFILL_TOKENS + job.answer_tokens
    rows = -(-job.rows // P)
    vd = a.vocab * a.hidden
    copies = wide_copies(a, job.compute_dtype, job.continuous)
    shard = sharded_bytes(a, P, p)
    m = {
        "master weights": shard,
        "gradients": shard,
        "optimizer state": 2 * shard,
        "rollout weights": a.parameters * c,
        "kv cache": rows * (job.prompt_tokens + steps) * a.layers * 2 * a.kv_heads * a.head_dim * c,
        "decode transients": copies * 4 * vd + rows * a.vocab * 4 * 4
                             + prefilled_rows(rows, job.group) * job.prompt_tokens * (3 * a.hidden + 2 * a.intermediate) * c,
        "soft inputs": rows * steps * a.hidden * 4 if job.continuous else 0,
    }
    mb, T = min(job.micro_batch, rows), job.prompt_tokens + steps
    per_layer = saved_per_token_layer(a, c)
    saved = mb * T * a.layers * (a.hidden * c if job.checkpointing else per_layer)
    m["activations"] = saved + mb * T * a.hidden * c * 4
    # the head (train.head_loss), whose peak is a micro-batch's peak on every paper job (traced): one chunk of
    # steps' logits at HEAD_FLOATS_PER_LOGIT float32 values a logit, and for soft / fuzzy the chunk's counter noise
    # drawn again (d floats a step); W's float32 gradient sum beside it, and an untied E's from the first mixture
    # on (so at a later chunk, whose steps are what the first leaves)
    steps_per_chunk = min(steps, logit_chunk_steps(mb))
    later = mb * min(steps_per_chunk, steps - steps_per_chunk)
    per_logit = 4 * (HEAD_FLOATS_PER_LOGIT if job.continuous else HARD_FLOATS_PER_LOGIT)

    def head_chunk(rows_: int) -> int:
        return rows_ * (a.vocab * per_logit + (a.hidden * 4 if job.continuous else 0))

    e_sum = 4 * vd if job.continuous and not a.tied else 0
    m["logits"] = max(head_chunk(mb * steps_per_chunk), head_chunk(later) + e_sum if later else 0)
    m["head gradients"] = 4 * vd
    # the root gathered in the compute dtype (the layers are resharded after their forward), float32 copies of W
    # (and of an untied E for the mixture) with their gradients where the head makes them
    m["gathered weights"] = a.root_params * c + 2 * 4 * vd * copies
    # a layer's backward (recomputed with checkpointing) beside the root's gradients and a gathered layer: planned too
    m["recomputed layer"] = ((mb * T * per_layer if job.checkpointing else 0)
                             + (a.root_params + 2 * a.layer_params) * c + 4 * vd + e_sum)
    m["optimizer temporaries"] = OPTIMIZER_TEMPORARIES[job.optimizer] * shard
    state = 0 if first_step else m["optimizer state"]
    m["held"] = m["master weights"] + state + m["rollout weights"]
    m["rollout"] = m["held"] + m["kv cache"] + m["decode transients"] + m["soft inputs"]
    # greedy validation: the rollout copy decodes val_rows slots (no recorded inputs), AdamW's state held beside it
    # once a step has run (validation at step >= 1); a save staged: every process gathers one tensor at a time to
    # copy it to the host (train.sharding.staged_weights), the largest in param_dtype beside what it holds
    vrows = job.val_rows or rows
    vsteps = (job.val_cot_tokens or job.cot_tokens) + PREFILL_TOKENS + job.answer_tokens
    m["validation kv cache"] = vrows * (job.prompt_tokens + vsteps) * a.layers * 2 * a.kv_heads * a.head_dim * c
    m["validation"] = (m["held"] + m["validation kv cache"] + copies * 4 * vd + vrows * a.vocab * 4 * 4
                       + vrows * job.prompt_tokens * (3 * a.hidden + 2 * a.intermediate) * c)
    m["staged save"] = m["held"] + max(math.prod(s) for s in a.shapes) * p
    # the gradient shards exist from a process's first micro-batch's backward on: its peak (at the head, before
    # any layer's gradient is reduced) holds them only where an earlier micro-batch made them
    earlier = m["gradients"] if -(-rows // mb) > 1 else 0
    m["backward"] = (m["held"] + earlier + m["soft inputs"] + m["activations"]
                     + max(m["logits"] + m["gathered weights"] + m["head gradients"], m["recomputed layer"]))
    # the step: AdamW's state (allocated by it at the first step) and its temporaries beside the gradients
    m["optimizer step"] = m["held"] + m["gradients"] + m["soft inputs"] + m["optimizer temporaries"] \
        + (m["optimizer state"] if first_step else 0)
    m["update"] = max(m["backward"], m["optimizer step"])
    m["peak"] = max(m[phase] for phase in LOOP_PHASES)
    return m


# every phase a training loop runs, each at the rows it really uses: the peak is the largest (train.loop)
LOOP_PHASES = ("rollout", "update", "validation", "staged save")
PHASES = ("held", "rollout", "backward", "optimizer step", "update", "validation", "staged save", "peak")


def eval_memory(arch: Architecture, batch: int, prompt_tokens: int, cot_tokens: int, answer_tokens: int,
                compute_dtype: str = "bfloat16", continuous: bool = True) -> dict[str, float]:
    a, c = arch, BYTES[compute_dtype]
    steps = cot_tokens + PREFILL_TOKENS + answer_tokens
    vd = a.vocab * a.hidden
    m = {"weights": a.parameters * c,
         "kv cache": batch * (prompt_tokens + steps) * a.layers * 2 * a.kv_heads * a.head_dim * c,
         "decode transients": wide_copies(a, compute_dtype, continuous) * 4 * vd
                              + batch * a.vocab * 4 * 4
                              + batch * prompt_tokens * (3 * a.hidden + 2 * a.intermediate) * c}
    # evaluation keeps no fed inputs, and the noise is counter noise drawn per step: nothing per row
    m["peak"] = sum(m.values())
    return m


LOGLIK_CHOICE_TOKENS = 64   # a multiple-choice continuation's tokens the plan allows (the longest scored at once)


def loglik_memory(arch: Architecture, batch: int, context_tokens: int, choice_tokens: int = LOGLIK_CHOICE_TOKENS,
                  compute_dtype: str = "bfloat16") -> dict[str, float]:
    """eval.loglik's peak (traced): at the head, the last hidden states of every token, a float32 copy of W
    (model.head.output_logits widens W on every device) and the float32 logits of the continuation's positions;
    the decoder's KV cache is gone by then (its peak does not grow with depth), its layers' transients below it."""
    a, c = arch, BYTES[compute_dtype]
    T = context_tokens + choice_tokens
    m = {"weights": a.parameters * c,
         "activations": batch * T * a.hidden * c,
         "logits": batch * choice_tokens * a.vocab * 4 + 4 * a.vocab * a.hidden,
         "layer transients": batch * T * (4 * a.hidden + 2 * a.intermediate) * c}
    m["peak"] = m["weights"] + max(m["activations"] + m["logits"], m["layer transients"])
    return m


# ---------------------------------------------------------------- a grid's jobs
def grid_architecture(grid: dict, model: str) -> Architecture:
    """A grid's model: the toy base it builds, or a hub or packaged model's shipped numbers (a local directory's
    config.json)."""
    spec = grid["models"][model]
    return toy_architecture(grid["toy_base"]) if spec["source"] == "toy" else load_architecture(spec["source"])


AUTO = "auto"
# micro-batches tried by `auto`, largest first; below MIN_FAST_MICRO_BATCH rows a micro-batch's fixed costs
# (FSDP gathers every layer's weights for each forward and backward) outweigh recomputing activations, and
# PREFERRED_MICRO_BATCH rows or more are preferred to fewer even at the price of recomputing (a named choice:
# issue 55 sized the GPUs of a run for it; docs/memory-plan.md; a GPU has yet to time (False, 4) against (True, 8))
MICRO_BATCHES = (64, 32, 16, 8, 4, 2, 1)
MIN_FAST_MICRO_BATCH = 4
PREFERRED_MICRO_BATCH = 8
# what is kept free of a GPU beyond the plan, as a share of the card (the grid's memory_plan.margin, a named choice:
# docs/memory-plan.md). The plan is within 2 % of the update peaks measured for llama-3b on one GPU (72.25 GB,
# foreach AdamW, micro-batch 2, H100; 58.0-58.6 GB, fused AdamW, micro-batch 16, first step, H200:
# tests/test_plan.py); a choice is made once and an out-of-memory at step 3,000 costs a day, so more than twice
# that error is kept free. `auto` and the per-job check (check_plan) both hold every phase's peak to it.
DEFAULT_MARGIN = 0.05
# rows a process may decode at once in greedy validation, tried largest first by `auto`
VAL_BATCHES = (256, 128, 64, 32, 16, 8, 4, 2, 1)


def plan_budget(grid: dict) -> float | None:
    """Bytes per GPU every phase of a job must fit: USABLE_SHARE of the card less the grid's margin (None: the grid
    declares no GPU memory, as the CPU grids)."""
    plan = grid.get("memory_plan", {})
    if not plan.get("gpu_memory_gb"):
        return None
    return (USABLE_SHARE - plan.get("margin", DEFAULT_MARGIN)) * plan["gpu_memory_gb"] * GB


def train_job_for(grid: dict, model: str, rl: dict, prompt: int, continuous: bool, micro_batch: int,
               checkpointing: bool) -> TrainJob:
    from softtokens.config.readings import validation_cot_cap

    processes = train_processes(grid, model)
    val_rows = -(-rl["val_size"] // processes)
    val_batch = rl.get("val_batch_size", AUTO)
    return TrainJob(processes=processes, rows=rl["prompts_per_step"] * rl["samples_per_prompt"],
                    micro_batch=micro_batch, prompt_tokens=prompt, cot_tokens=rl["cot_max_tokens"],
                    answer_tokens=rl["answer_max_tokens"], continuous=continuous, param_dtype=rl["param_dtype"],
                    compute_dtype=rl["compute_dtype"], checkpointing=checkpointing,
                    val_rows=min(val_rows, int(_schema_defaults()["val_batch_size"] if val_batch == AUTO else val_batch)),
                    val_cot_tokens=validation_cot_cap(rl, grid.get("evaluation")), group=rl["samples_per_prompt"])


def resolve_memory(config: dict, grid_name: str, model: str, rl: dict, continuous: bool = True) -> dict:
    """A training cell's rl with ``micro_batch_size``, ``activation_checkpointing`` and ``val_batch_size`` `auto`
    chosen by the memory plan: every phase of the loop (rollout, update, greedy validation, a staged save) within
    the grid's budget (plan_budget: the usable share of memory_plan.gpu_memory_gb less its margin).
    Preferred: micro-batches of PREFERRED_MICRO_BATCH rows or more (without recomputation, 6 instead of 8 FLOPs a
    parameter and token, then with it), then of MIN_FAST_MICRO_BATCH or more, each tier the largest first, without
    recomputation first; validation decodes the most rows at once that
    fit (VAL_BATCHES, no more than a process validates). A grid that declares no GPU memory takes the schema's
    defaults. What is chosen is what the job's settings (and provenance) say."""
    mb_auto, ac_auto = rl["micro_batch_size"] == AUTO, rl["activation_checkpointing"] == AUTO
    val_auto = rl.get("val_batch_size") == AUTO
    if not (mb_auto or ac_auto or val_auto):
        return rl
    grid = config["grids"][grid_name]
    budget = plan_budget(grid)
    out = dict(rl)
    if budget is None:
        defaults = _schema_defaults()
        out.update({k: defaults[k] for k, auto in (("micro_batch_size", mb_auto), ("activation_checkpointing", ac_auto),
                                                   ("val_batch_size", val_auto)) if auto})
        return out
    arch = grid_architecture(grid, model)
    prompt = int(grid.get("memory_plan", {}).get("prompt_tokens", 512))
    processes = train_processes(grid, model)
    rows = -(-rl["prompts_per_step"] * rl["samples_per_prompt"] // processes)
    if mb_auto or ac_auto:
        sizes = [m for m in MICRO_BATCHES if m <= rows] if mb_auto else [rl["micro_batch_size"]]
        checkpointing = (False, True) if ac_auto else (bool(rl["activation_checkpointing"]),)
        tiers = ([m for m in sizes if m >= PREFERRED_MICRO_BATCH],
                 [m for m in sizes if MIN_FAST_MICRO_BATCH <= m < PREFERRED_MICRO_BATCH],
                 [m for m in sizes if m < MIN_FAST_MICRO_BATCH])
        candidates = [(ac, m) for tier in tiers for ac in checkpointing for m in tier]
        chosen = candidates[-1]  # nothing fits: the smallest, which check_plan then reports
        for ac, m in candidates:
            phases = train_memory(arch, train_job_for(grid, model, {**rl, "val_batch_size": 1}, prompt, continuous,
                                                      m, ac))
            if max(phases["rollout"], phases["update"], phases["staged save"]) <= budget:
                chosen = (ac, m)
                break
        out["activation_checkpointing"], out["micro_batch_size"] = chosen
    if val_auto:
        most = -(-rl["val_size"] // processes)
        fits = [v for v in VAL_BATCHES if v <= most and train_memory(arch, train_job_for(
            grid, model, {**out, "val_batch_size": v}, prompt, continuous, out["micro_batch_size"],
            bool(out["activation_checkpointing"])))["validation"] <= budget]
        out["val_batch_size"] = fits[0] if fits else 1   # nothing fits: one row, which check_plan then reports
    return out


def _schema_defaults() -> dict:
    from softtokens.config.grids import load_schema

    fields = load_schema()["$defs"]["rl_fields"]
    return {k: fields[k]["default"] for k in ("micro_batch_size", "activation_checkpointing", "val_batch_size")}


def grid_plan(config: dict, grid_name: str) -> list[dict]:
    """One row per training cell (its soft/fuzzy runs, the larger) and per evaluated model."""
    grid = config["grids"][grid_name]
    plan_cfg = grid.get("memory_plan", {})
    prompt = int(plan_cfg.get("prompt_tokens", 512))
    rows = []
    for cell in grid["training"]:
        model, dataset = cell["model"], cell["dataset"]
        continuous = bool(set(cell["modes"]) - {"hard"})
        rl = resolve_memory(config, grid_name, model, cell_rl(config, grid_name, model, dataset), continuous)
        arch = grid_architecture(grid, model)
        job = train_job_for(grid, model, rl, prompt, continuous, rl["micro_batch_size"], bool(rl["activation_checkpointing"]))
        rows.append({"job": f"train {model}/{dataset}", "gpus": job.processes, "parameters": arch.parameters,
                     "setting": f"B*G {job.rows}, micro-batch {job.micro_batch}, CoT {job.cot_tokens}"
                                f"{', checkpointing' if job.checkpointing else ''}, validation {job.val_rows} rows "
                                f"x CoT {job.val_cot_tokens}",
                     "memory": train_memory(arch, job), "job_shape": job, "model": model, "arch": arch})
    ev = {**EVAL_DEFAULTS, **grid["evaluation"]}
    compute = resolved_rl(config, grid_name)["compute_dtype"]
    for model in ev["models"]:
        arch = grid_architecture(grid, model)
        rows.append({"job": f"evaluate {model}", "gpus": 1, "parameters": arch.parameters,
                     "setting": f"batch {ev['batch_size']}, CoT {ev['cot_max_tokens']}",
                     "memory": eval_memory(arch, ev["batch_size"], prompt, ev["cot_max_tokens"],
                                           ev["answer_max_tokens"], compute), "model": model, "arch": arch,
                     "compute_dtype": compute,
                     "eval_shape": {"batch": ev["batch_size"], "prompt_tokens": prompt, "cot_tokens": ev["cot_max_tokens"],
                                    "answer_tokens": ev["answer_max_tokens"]}})
        if ev.get("ood_benchmarks"):
            rows.append({"job": f"evaluate_loglik {model}", "gpus": 1, "parameters": arch.parameters,
                         "setting": f"batch {ev['loglik_batch_size']}",
                         "memory": loglik_memory(arch, ev["loglik_batch_size"], prompt, compute_dtype=compute),
                         "model": model, "arch": arch, "compute_dtype": compute,
                         "loglik_shape": {"batch": ev["loglik_batch_size"], "context_tokens": prompt,
                                          "choice_tokens": LOGLIK_CHOICE_TOKENS}})
    return rows


def plan_table(rows: list[dict], budget: float | None) -> str:
    """A markdown table, GB per GPU (1 GB = 1e9 bytes): what a job holds, then the peak of each phase it runs
    (a training job's loop: rollout, update, greedy validation, a staged save), its peak and whether it fits
    ``budget`` (plan_budget)."""
    cols = ["master weights", "optimizer state", "rollout weights", "kv cache", "activations", "logits"]
    phases = [p for p in LOOP_PHASES]
    head = ["job", "GPUs", "params (B)", "setting", *cols, *(f"{p} GB" for p in phases), "peak GB", "fits"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m = r["memory"]
        weights = m.get("weights")
        vals = [_gb(m[c]) if c in m else ("" if weights is None or c != "rollout weights" else _gb(weights))
                for c in cols]
        at = [_gb(m[p]) if p in m else "" for p in phases]
        fits = "" if budget is None else ("yes" if m["peak"] <= budget else "**no**")
        lines.append("| " + " | ".join([r["job"], str(r["gpus"]), f"{r['parameters'] / 1e9:.3g}", r["setting"], *vals,
                                         *at, _gb(m["peak"]), fits]) + " |")
    return "\n".join(lines)


def _gb(n: float) -> str:
    return f"{n / GB:.1f}" if n >= 0.05 * GB else f"{n / GB:.2g}"


class PlanError(ValueError):
    """A job of the grid cannot fit the GPU memory the grid declares."""


def check_plan(config: dict, grid_name: str) -> None:
    """Stop (before any job starts) if a job's peak, over every phase it runs, exceeds the grid's budget (plan_budget:
    the usable share of ``memory_plan.gpu_memory_gb`` less its margin); grids without it (CPU, the toy) are not
    checked here (their host memory is: sizing.host)."""
    grid = config["grids"][grid_name]
    budget = plan_budget(grid)
    if budget is None:
        return
    too_big = [r for r in grid_plan(config, grid_name) if r["memory"]["peak"] > budget]
    if too_big:
        lines = [f"{r['job']} on {r['gpus']} GPU(s) ({r['setting']}): {r['memory']['peak'] / GB:.1f} GB per GPU at "
                 f"its {_largest_phase(r['memory'])}" for r in too_big]
        raise PlanError(f"grid {grid_name!r}: {len(too_big)} job(s) do not fit {budget / GB:.1f} GB per GPU "
                        f"({USABLE_SHARE:.0%} of memory_plan.gpu_memory_gb {grid['memory_plan']['gpu_memory_gb']} less "
                        f"its margin):\n  " + "\n  ".join(lines)
                        + "\nGive the model more GPUs (models.<m>.train_gpus), a smaller micro_batch_size or "
                          "val_batch_size, or activation_checkpointing: true; `softtokens plan` prints every phase.")


def _largest_phase(m: dict) -> str:
    phases = [p for p in LOOP_PHASES if p in m] or ["peak"]
    return max(phases, key=lambda p: m[p])
