"""The per-GPU memory plan of every training and evaluation job of a grid, from each model's
architecture numbers (shipped under ``architectures/``: no download), so that a grid whose
jobs cannot fit the GPU memory it declares stops before any job starts.

What a training job holds on each of its P processes (softtokens.sharding):
- master weights, their gradients and AdamW's two moments in ``param_dtype``, sharded over P
  (FSDP2 splits each tensor along dim 0 into P chunks; rank 0 holds the largest);
- the rollout copy of the whole model in ``compute_dtype``;
- while decoding its B*G/P rows: the KV cache, float32 copies of the output projection (and of E
  when untied, for the soft mixture), per-step logits and the recorded float32 soft inputs (the
  Gaussian noise is counter noise, drawn per step and again in the update: never held);
- while updating one micro-batch: the gathered compute-dtype weights and gradients of the root
  (E, head, final norm) and of two decoder layers (FSDP prefetches one), float32 copies of the
  projection (and their gradients), the activations a layer saves for its backward (all layers,
  or with activation checkpointing only each layer's input plus one layer recomputed), and the
  float32 logits of one chunk of LOGIT_CHUNK_STEPS steps (rloo.rollout_log_probs).
The saved-activation count per token and layer is that of a Llama/Qwen2 block under SDPA with a
padding mask (K and V repeated to all heads): 4d + 4 h hd + 4 kv hd + 4 I values.
Parameters, gradients and optimizer state are exact (tests compare them with what FSDP
allocates on CPU); activations and transients are estimates, checked on a GPU when one is lent.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from softtokens.run.config import EVAL_DEFAULTS, cell_rl, resolved_rl
from softtokens.run.jobs import train_processes
from softtokens.train.config import LOGIT_CHUNK_STEPS

GB = 1e9
ARCHITECTURES = Path(__file__).resolve().parents[1] / "architectures"
BYTES = {"float32": 4, "bfloat16": 2, "float64": 8}
PREFILL_TOKENS = 16        # "The final answer is: \boxed{" and the short one after the stop text
USABLE_SHARE = 0.9         # of a GPU's memory: CUDA context, NCCL buffers, allocator fragmentation


@dataclass(frozen=True)
class Architecture:
    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    shapes: tuple[tuple[int, ...], ...]      # every parameter tensor (tied ones once)
    layer_params: int                        # parameters of one decoder layer
    root_params: int                         # embeddings, final norm, output head

    @property
    def parameters(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


def architecture_file(source: str) -> Path:
    return ARCHITECTURES / f"{source.replace('/', '__')}.json"


def load_architecture(source: str) -> Architecture:
    """A shipped hub model's numbers, or the config.json of a local model directory."""
    shipped = architecture_file(source)
    path = shipped if shipped.is_file() else Path(source) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no architecture numbers for {source!r}: ship {shipped.name} under "
                                f"src/softtokens/architectures/ (its hub config.json) or point to a local model")
    return _from_config_json(path.read_text(), source)


def toy_architecture(toy_base: dict) -> Architecture:
    """The toy base the workflow builds (model.toy.build_toy_model) from its grid settings."""
    d = toy_base
    cfg = {"model_type": "llama", "vocab_size": d["vocab_size"], "hidden_size": d["hidden_size"],
           "num_hidden_layers": d["num_layers"], "num_attention_heads": d["num_heads"],
           "num_key_value_heads": d["num_heads"], "intermediate_size": d["intermediate_size"],
           "tie_word_embeddings": True}
    return _from_config_json(json.dumps(cfg), "toy")


# The decoder families the grids use, their parameter lists written out in the model classes' own
# order (tests/test_plan.py holds them equal to transformers' classes built on the meta device).
# Planning a grid then needs neither torch nor transformers: every `snakemake` start parses the
# workflow, which checks the plan, and so does every job a cluster executor starts.
# Fields a config.json may leave out take their config class's defaults:
DECODER_DEFAULTS = {"llama": {"attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False},
                    "qwen2": {"tie_word_embeddings": False}}


def _decoder_shapes(cfg: dict, heads: int, kv: int, hd: int) -> tuple[list, list, list]:
    """(root before the layers, one layer, root after them) parameter shapes of a llama / qwen2
    decoder from its config fields (``heads``, ``kv`` heads and head dim ``hd`` resolved)."""
    d, v, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    if cfg["model_type"] == "llama":   # q, k, v, o and the MLP's three projections: config flags
        qkv_bias = o_bias = bool(cfg["attention_bias"])
        mlp_bias = bool(cfg["mlp_bias"])
    else:                              # qwen2: q, k, v with biases, o and the MLP without
        qkv_bias, o_bias, mlp_bias = True, False, False

    def linear(out: int, into: int, bias: bool) -> list:
        return [(out, into), (out,)] if bias else [(out, into)]

    layer = (linear(heads * hd, d, qkv_bias) + linear(kv * hd, d, qkv_bias) + linear(kv * hd, d, qkv_bias)
             + linear(d, heads * hd, o_bias)
             + linear(inter, d, mlp_bias) + linear(inter, d, mlp_bias) + linear(d, inter, mlp_bias)
             + [(d,), (d,)])                                                   # the two RMSNorms
    tail = [(d,)] + ([] if cfg["tie_word_embeddings"] else [(v, d)])          # final norm, untied head
    return [(v, d)], layer, tail


@lru_cache(maxsize=None)
def _from_config_json(text: str, name: str) -> Architecture:
    """A model's numbers from its config.json: written out for the decoder families of
    DECODER_DEFAULTS, otherwise read off the model class built on the meta device (no memory)."""
    fields = {k: v for k, v in json.loads(text).items() if not k.startswith("_")}
    kind = fields.get("model_type")
    if kind not in DECODER_DEFAULTS:
        return _meta_architecture(fields, name)
    cfg = {**DECODER_DEFAULTS[kind], **fields}
    heads = cfg["num_attention_heads"]
    kv, hd = cfg.get("num_key_value_heads") or heads, cfg.get("head_dim") or cfg["hidden_size"] // heads
    head, layer, tail = _decoder_shapes(cfg, heads, kv, hd)
    return Architecture(name=name, vocab=cfg["vocab_size"], hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"],
                        heads=heads, kv_heads=kv, head_dim=hd,
                        intermediate=cfg["intermediate_size"], tied=bool(cfg["tie_word_embeddings"]),
                        shapes=tuple(head + layer * cfg["num_hidden_layers"] + tail),
                        layer_params=sum(math.prod(s) for s in layer),
                        root_params=sum(math.prod(s) for s in head + tail))


def _meta_architecture(fields: dict, name: str) -> Architecture:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(fields)
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    named = list(model.named_parameters())  # tied weights once
    layer = sum(p.numel() for n, p in named if ".layers.0." in n)
    root = sum(p.numel() for n, p in named if ".layers." not in n)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return Architecture(name=name, vocab=cfg.vocab_size, hidden=cfg.hidden_size, layers=cfg.num_hidden_layers,
                        heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads, head_dim=head_dim,
                        intermediate=cfg.intermediate_size, tied=bool(cfg.tie_word_embeddings),
                        shapes=tuple(tuple(p.shape) for _, p in named), layer_params=layer, root_params=root)


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


def saved_per_token_layer(arch: Architecture) -> int:
    """Values a decoder layer saves per token for its backward (module docstring)."""
    a = arch
    return 4 * a.hidden + 4 * a.heads * a.head_dim + 4 * a.kv_heads * a.head_dim + 4 * a.intermediate


def train_memory(arch: Architecture, job: TrainJob) -> dict[str, float]:
    """Bytes per GPU of one training process, by component, and the peak."""
    a, P = arch, job.processes
    p, c = BYTES[job.param_dtype], BYTES[job.compute_dtype]
    steps = job.cot_tokens + PREFILL_TOKENS + job.answer_tokens
    rows = -(-job.rows // P)
    vd = a.vocab * a.hidden
    wide_copies = 0 if c >= 4 else (1 + (job.continuous and not a.tied))  # float32 W (and E) while decoding
    m = {
        "master weights": sharded_bytes(a, P, p),
        "gradients": sharded_bytes(a, P, p),
        "optimizer state": 2 * sharded_bytes(a, P, p),
        "rollout weights": a.parameters * c,
        "kv cache": rows * (job.prompt_tokens + steps) * a.layers * 2 * a.kv_heads * a.head_dim * c,
        "decode transients": wide_copies * 4 * vd + rows * a.vocab * 4 * 4
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
    # float32 logits of LOGIT_CHUNK_STEPS steps at a time (rloo.rollout_log_probs), recomputed in the backward,
    # and for soft / fuzzy the chunk's counter noise drawn again (d floats a step)
    chunk = mb * min(steps, LOGIT_CHUNK_STEPS)
    m["logits"] = chunk * a.vocab * 4 * (6 if job.continuous else 4) + (chunk * a.hidden * 4 if job.continuous else 0)
    # float32 copies of W (and of E for the mixture, when untied) and their gradients
    fp32_proj = 0 if c >= 4 else 2 * 4 * vd * (2 if job.continuous and not a.tied else 1)
    m["gathered weights"] = 2 * (a.root_params + 2 * a.layer_params) * c + fp32_proj
    held = m["master weights"] + m["optimizer state"] + m["rollout weights"]
    rollout_phase = m["kv cache"] + m["decode transients"] + m["soft inputs"]
    update_phase = m["gradients"] + m["soft inputs"] + m["activations"] + m["logits"] + m["gathered weights"]
    m["peak"] = held + max(rollout_phase, update_phase)
    return m


def eval_memory(arch: Architecture, batch: int, prompt_tokens: int, cot_tokens: int, answer_tokens: int,
                compute_dtype: str = "bfloat16", continuous: bool = True) -> dict[str, float]:
    a, c = arch, BYTES[compute_dtype]
    steps = cot_tokens + PREFILL_TOKENS + answer_tokens
    vd = a.vocab * a.hidden
    m = {"weights": a.parameters * c,
         "kv cache": batch * (prompt_tokens + steps) * a.layers * 2 * a.kv_heads * a.head_dim * c,
         "decode transients": (0 if c >= 4 else (1 + (continuous and not a.tied)) * 4 * vd)
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
         "logits": batch * choice_tokens * a.vocab * 4 * 2 + (0 if c >= 4 else 4 * a.vocab * a.hidden)}
    m["peak"] = sum(m.values())
    return m


# ---------------------------------------------------------------- a grid's jobs
def grid_architecture(grid: dict, model: str) -> Architecture:
    """A grid's model: the toy base it builds, or a hub model's shipped numbers."""
    spec = grid["models"][model]
    return toy_architecture(grid["toy_base"]) if spec["source"] == "toy" else load_architecture(spec["source"])


AUTO = "auto"
# micro-batches tried by `auto`, largest first; below MIN_FAST_MICRO_BATCH rows a micro-batch's fixed costs
# (FSDP gathers every layer's weights for each forward and backward) outweigh recomputing activations
MICRO_BATCHES = (64, 32, 16, 8, 4, 2, 1)
MIN_FAST_MICRO_BATCH = 4
# what `auto` leaves between its choice's planned peak and the usable memory: the plan was 7 % under the
# peak an H100 measured for llama-3b on one GPU (benchmarks/results/gpu_check_h100.json); a choice is
# made once and an out-of-memory at step 3,000 costs a day
AUTO_HEADROOM = 1.10


def _train_job(grid: dict, model: str, rl: dict, prompt: int, continuous: bool, micro_batch: int,
               checkpointing: bool) -> TrainJob:
    return TrainJob(processes=train_processes(grid, model), rows=rl["prompts_per_step"] * rl["samples_per_prompt"],
                    micro_batch=micro_batch, prompt_tokens=prompt, cot_tokens=rl["cot_max_tokens"],
                    answer_tokens=rl["answer_max_tokens"], continuous=continuous, param_dtype=rl["param_dtype"],
                    compute_dtype=rl["compute_dtype"], checkpointing=checkpointing)


def resolve_memory(config: dict, grid_name: str, model: str, rl: dict, continuous: bool = True) -> dict:
    """A training cell's rl with ``micro_batch_size: auto`` and ``activation_checkpointing: auto`` chosen by
    the memory plan: the fastest that fits the usable share of the grid's memory_plan.gpu_memory_gb with
    AUTO_HEADROOM to spare.
    Faster means no recomputation (8 instead of 6 FLOPs a parameter and token) with micro-batches of at
    least MIN_FAST_MICRO_BATCH rows, then the largest micro-batch; a grid that declares no GPU memory
    takes the schema's defaults. What is chosen is what the job's settings (and provenance) say."""
    mb_auto, ac_auto = rl["micro_batch_size"] == AUTO, rl["activation_checkpointing"] == AUTO
    if not (mb_auto or ac_auto):
        return rl
    grid = config["grids"][grid_name]
    gpu_gb = grid.get("memory_plan", {}).get("gpu_memory_gb")
    out = dict(rl)
    if not gpu_gb:
        defaults = _schema_defaults()
        out.update({k: defaults[k] for k, auto in (("micro_batch_size", mb_auto), ("activation_checkpointing", ac_auto))
                    if auto})
        return out
    arch = grid_architecture(grid, model)
    prompt = int(grid.get("memory_plan", {}).get("prompt_tokens", 512))
    rows = -(-rl["prompts_per_step"] * rl["samples_per_prompt"] // train_processes(grid, model))
    sizes = [m for m in MICRO_BATCHES if m <= rows] if mb_auto else [rl["micro_batch_size"]]
    checkpointing = (False, True) if ac_auto else (bool(rl["activation_checkpointing"]),)
    fast = [(ac, m) for ac in checkpointing for m in sizes if m >= MIN_FAST_MICRO_BATCH]
    candidates = fast + [(ac, m) for ac in checkpointing for m in sizes if (ac, m) not in fast]
    budget = USABLE_SHARE * gpu_gb * GB / AUTO_HEADROOM
    chosen = candidates[-1]  # nothing fits: the smallest, which check_plan then reports
    for ac, m in candidates:
        if train_memory(arch, _train_job(grid, model, rl, prompt, continuous, m, ac))["peak"] <= budget:
            chosen = (ac, m)
            break
    out["activation_checkpointing"], out["micro_batch_size"] = chosen
    return out


def _schema_defaults() -> dict:
    from softtokens.run.config import load_schema

    fields = load_schema()["$defs"]["rl_fields"]
    return {k: fields[k]["default"] for k in ("micro_batch_size", "activation_checkpointing")}


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
        job = _train_job(grid, model, rl, prompt, continuous, rl["micro_batch_size"], bool(rl["activation_checkpointing"]))
        rows.append({"job": f"train {model}/{dataset}", "gpus": job.processes, "parameters": arch.parameters,
                     "setting": f"B*G {job.rows}, micro-batch {job.micro_batch}, CoT {job.cot_tokens}"
                                f"{', checkpointing' if job.checkpointing else ''}",
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


def plan_table(rows: list[dict], gpu_memory_gb: float | None) -> str:
    """A markdown table, GB per GPU (1 GB = 1e9 bytes)."""
    cols = ["master weights", "gradients", "optimizer state", "rollout weights", "kv cache", "activations", "logits"]
    head = ["job", "GPUs", "params (B)", "setting", *cols, "peak GB", "fits"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m = r["memory"]
        weights = m.get("weights")
        vals = [_gb(m[c]) if c in m else ("" if weights is None or c != "rollout weights" else _gb(weights))
                for c in cols]
        fits = "" if gpu_memory_gb is None else ("yes" if m["peak"] <= USABLE_SHARE * gpu_memory_gb * GB else "**no**")
        lines.append("| " + " | ".join([r["job"], str(r["gpus"]), f"{r['parameters'] / 1e9:.3g}", r["setting"], *vals,
                                         _gb(m["peak"]), fits]) + " |")
    return "\n".join(lines)


def _gb(n: float) -> str:
    return f"{n / GB:.1f}" if n >= 0.05 * GB else f"{n / GB:.2g}"


class PlanError(ValueError):
    """A job of the grid cannot fit the GPU memory the grid declares."""


def check_plan(config: dict, grid_name: str) -> None:
    """Stop (before any job starts) if a job's peak exceeds the usable share of the grid's
    ``memory_plan.gpu_memory_gb``; grids without it (CPU, the toy) are not checked."""
    grid = config["grids"][grid_name]
    gpu_gb = grid.get("memory_plan", {}).get("gpu_memory_gb")
    if not gpu_gb:
        return
    too_big = [r for r in grid_plan(config, grid_name) if r["memory"]["peak"] > USABLE_SHARE * gpu_gb * GB]
    if too_big:
        lines = [f"{r['job']} on {r['gpus']} GPU(s) ({r['setting']}): {r['memory']['peak'] / GB:.1f} GB per GPU"
                 for r in too_big]
        raise PlanError(f"grid {grid_name!r}: {len(too_big)} job(s) do not fit {USABLE_SHARE:.0%} of "
                        f"{gpu_gb} GB per GPU (memory_plan.gpu_memory_gb):\n  " + "\n  ".join(lines)
                        + "\nGive the model more GPUs (models.<m>.train_gpus), a smaller micro_batch_size, or "
                          "activation_checkpointing: true; `softtokens plan` prints every component.")
