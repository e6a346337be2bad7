"""The per-GPU memory plan of every training and evaluation job of a grid, from each model's
architecture numbers (shipped under ``architectures/``: no download), so that a grid whose
jobs cannot fit the GPU memory it declares stops before any job starts.

What a training job holds on each of its P processes (softtokens.sharding):
- master weights, their gradients and AdamW's two moments in ``param_dtype``, sharded over P
  (FSDP2 splits each tensor along dim 0 into P chunks; rank 0 holds the largest);
- the rollout copy of the whole model in ``compute_dtype``;
- while decoding its B*G/P rows: the KV cache, per-step logits and the recorded float32 soft inputs
  (the Gaussian noise is counter noise, drawn per step and again in the update: never held); no
  float32 copy of the output projection where bf16 GEMMs write float32 results (FUSED_WIDE_GEMM);
- while updating one micro-batch (the backward phase): the gradients, the gathered compute-dtype
  weights and gradients of the root (E, head, final norm) and of two decoder layers (FSDP prefetches
  one), the activations a layer saves for its backward (all layers, or with activation checkpointing
  only each layer's input plus one layer recomputed), and the float32 logits of one chunk of
  rloo.logit_chunk_steps steps, and the head's (and an untied E's) weight gradient summed in float32 over
  them (train.head_loss);
- at the optimizer step: the gradients and what the AdamW implementation allocates besides its
  state: the default multi-tensor (foreach) kernels a full-size float32 temporary of the sharded
  parameters (12.85 GB for a 3.2B model, measured on an H100), the fused kernels nothing of that size
  (measured on an H200: 58.0-58.6 GB at the first step, micro-batch 16). The update peak is the
  larger of the two phases. At a run's first step AdamW has no state until its step allocates it
  (``first_step``: what a one-step gpu-check measures).
The saved-activation count per token and layer is that of a Llama/Qwen2 block under SDPA with a
padding mask (K and V repeated to all heads): 4d + 4 h hd + 4 kv hd + 4 I values.
Parameters, gradients and optimizer state are exact (tests compare them with what FSDP
allocates on CPU); activations and transients are estimates, checked on a GPU when one is lent.
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
from softtokens.train.config import HEAD_TILE_ROWS, logit_chunk_steps

GB = 1e9
BYTES = {"float32": 4, "bfloat16": 2, "float64": 8}
USABLE_SHARE = 0.9         # of a GPU's memory: CUDA context, NCCL buffers, allocator fragmentation
# the GPU jobs' torch multiplies bf16 matrices into float32 results in one GEMM (model.head.fused_wide_matmul:
# CUDA's torch.mm(..., out_dtype)), so no float32 copy of the vocabulary projection exists on a GPU
FUSED_WIDE_GEMM = True
# AdamW's implementations and the float32 temporaries of the sharded parameters' size each allocates in step()
# (train.optimizer chooses "fused" where the device has the kernels)
OPTIMIZER_TEMPORARIES = {"fused": 0, "foreach": 1}


def head_gradient_bytes(a: Architecture, continuous: bool, fused: bool = True) -> int:
    """The head's float32 weight-gradient memory in the update's backward. Fused (train.head_loss): W's sum
    (and an untied E's under soft / fuzzy tokens), held over a micro-batch's chunks, plus one tile of the
    product (train.config.HEAD_TILE_ROWS rows: its float32 output over the gradient and its bf16 remainder,
    and their sum). The checkpointed path (rloo, a weight gradient handed to autograd per chunk): W's
    accumulated gradient and a chunk's new one beside it, and for an untied E the same again; with
    float32 operands its product is made over the operand and its remainder at once (2V x d) and summed
    (V x d) before it is added: the fused path's peak is below it (tests/test_plan.py)."""
    vd = a.vocab * a.hidden
    matrices = 1 + (continuous and not a.tied)
    if fused:
        return 4 * vd * matrices + 3 * 4 * min(a.vocab, HEAD_TILE_ROWS) * a.hidden
    return 4 * vd * matrices * 2 + 3 * 4 * vd


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


def saved_per_token_layer(arch: Architecture) -> int:
    """Values a decoder layer saves per token for its backward (module docstring)."""
    a = arch
    return 4 * a.hidden + 4 * a.heads * a.head_dim + 4 * a.kv_heads * a.head_dim + 4 * a.intermediate


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
                             + rows * job.prompt_tokens * (3 * a.hidden + 2 * a.intermediate) * c,
        "soft inputs": rows * steps * a.hidden * 4 if job.continuous else 0,
    }
    mb, T = min(job.micro_batch, rows), job.prompt_tokens + steps
    per_layer = saved_per_token_layer(a) * c
    if job.checkpointing:
        acts = mb * T * (a.layers * a.hidden * c + per_layer)
    else:
        acts = mb * T * a.layers * per_layer
    m["activations"] = acts + mb * T * a.hidden * c * 4
    # float32 logits of one chunk of steps (rloo.rollout_log_probs), recomputed in the backward, and for
    # soft / fuzzy the chunk's counter noise drawn again (d floats a step)
    chunk = mb * min(steps, logit_chunk_steps(mb))
    m["logits"] = chunk * a.vocab * 4 * (6 if job.continuous else 4) + (chunk * a.hidden * 4 if job.continuous else 0)
    # the gathered root and two layers in the compute dtype (and their gradients), float32 copies of W (and of
    # an untied E for the mixture) with their gradients where the head makes them
    m["gathered weights"] = 2 * (a.root_params + 2 * a.layer_params) * c + 2 * 4 * vd * copies
    m["head gradients"] = head_gradient_bytes(a, job.continuous)
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
    m["backward"] = (m["held"] + m["gradients"] + m["soft inputs"] + m["activations"] + m["logits"]
                     + m["gathered weights"] + m["head gradients"])
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


def loglik_memory(arch: Architecture, batch: int, context_tokens: int, choice_tokens: int = 64,
                  compute_dtype: str = "bfloat16") -> dict[str, float]:
    a, c = arch, BYTES[compute_dtype]
    T = context_tokens + choice_tokens
    m = {"weights": a.parameters * c,
         "activations": batch * T * (4 * a.hidden + 2 * a.intermediate) * c + batch * T * a.layers * 2 * a.kv_heads * a.head_dim * c,
         "logits": batch * choice_tokens * a.vocab * 4 * 2 + wide_copies(a, compute_dtype, False) * 4 * a.vocab * a.hidden}
    m["peak"] = sum(m.values())
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
                    val_cot_tokens=validation_cot_cap(rl, grid.get("evaluation")))


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
                     "memory": train_memory(arch, job)})
    ev = {**EVAL_DEFAULTS, **grid["evaluation"]}
    compute = resolved_rl(config, grid_name)["compute_dtype"]
    for model in ev["models"]:
        arch = grid_architecture(grid, model)
        rows.append({"job": f"evaluate {model}", "gpus": 1, "parameters": arch.parameters,
                     "setting": f"batch {ev['batch_size']}, CoT {ev['cot_max_tokens']}",
                     "memory": eval_memory(arch, ev["batch_size"], prompt, ev["cot_max_tokens"],
                                           ev["answer_max_tokens"], compute)})
        if ev.get("ood_benchmarks"):
            rows.append({"job": f"evaluate_loglik {model}", "gpus": 1, "parameters": arch.parameters,
                         "setting": f"batch {ev['loglik_batch_size']}",
                         "memory": loglik_memory(arch, ev["loglik_batch_size"], prompt, compute_dtype=compute)})
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
