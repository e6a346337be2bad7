"""`softtokens gpu-check`: the paper's GPU path verified in one command, before a cluster run.

A GPU is rare here (one task in twenty is lent one, for 30 minutes) and a researcher's first
``snakemake --profile slurm`` should not be the first GPU run. So every part of the paper path
that behaves differently on a GPU runs in one self-contained command, on a random-weight model
built from the shipped ``config.json`` of the paper's Llama-3.2-3B (no download, no math-verify,
no Snakemake), at the paper grid's sizes read from ``config.yaml`` (the llama-3b x math cell and
the paper grid's evaluation):

- engine: ms per decode step in the six settings beside the memory-bandwidth bound; whether
  the step was captured in a CUDA graph; greedy hard tokens equal to HF ``generate`` (float32);
  graph replay equal to the eager step; noise fresh per step and row, and reproducible by seed;
- evaluation: one batch of each setting at the evaluation batch size, the out-of-domain scorer,
  peak memory beside ``softtokens plan``;
- training: RLOO steps of the cell (float32 master, bf16 compute, FSDP2, activation
  checkpointing), step time split rollout / reward / update, peak memory beside the plan (held,
  rollout phase, update phase), the share of master entries moved, replay residual and argmax
  mismatch against the paper-grid bounds, a checkpoint reloaded by plain ``from_pretrained``,
  the sharded optimizer state saved and loaded (torch.distributed.checkpoint).

Random weights never answer right, so the training section grades with a stand-in that gives
each completion a reward from its hash: rewards vary within a prompt's group, so RLOO has a
gradient, which is all a systems check needs. ``--smoke`` runs the same code on a tiny model (on
the CPU if there is no GPU) in seconds; CI runs it. Writes ``DIR/gpu_check.json`` (rewritten
after each section, so a run stopped by a time limit keeps what it measured) and
``DIR/gpu_check.md``. docs/gpu.md says how to read it.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from softtokens.data import format_prompt, toy_choice_rows, toy_splits
from softtokens.generation import INFERENCE_SETTINGS, CotEngine
from softtokens.modeling import DTYPES, Float32Head, embedding_scale, train_toy_tokenizer

SECTIONS = ("engine", "evaluation", "training")
PAPER_MODEL, PAPER_DATASET = "llama-3b", "math"   # the paper grid's cell this checks
TIE_THRESHOLD_SCALE = 6.0   # |cos| of fresh noise vectors in d dims is ~sqrt(2 / (pi d)); frozen noise gives ~1
PLAN_TOLERANCE = 0.15        # measured peak memory within 15 % of `softtokens plan`'s estimate
MOVED_MIN = 0.99             # share of float32 master entries an AdamW step must change
# Random weights give nearly flat next-token distributions (entropy ~11 nats over 128k tokens), where
# every step is a near tie that bf16 noise flips. A trained model's are peaked. The final norm's weight
# is scaled so the next-token entropy after a prompt is this (the scale and both entropies go in the
# JSON); shapes, bytes and timings do not change, only how often a replay meets a near tie.
TARGET_ENTROPY = 1.0  # nats
# the tiny model of --smoke: Llama-3's shape in miniature (grouped-query attention, tied embeddings)
SMOKE_ARCHITECTURE = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True,
                      "rope_theta": 500000.0, "max_position_embeddings": 2048}
SMOKE_SIZES = {"prompts_per_step": 2, "samples_per_prompt": 4, "cot_max_tokens": 8, "answer_max_tokens": 4,
               "micro_batch_size": 4}


@dataclass(frozen=True)
class CheckShape:
    """What the check runs: the paper cell's settings, or --smoke's cut sizes of the same."""

    source: str                 # the architecture: a hub id whose config.json ships with the package, or "smoke"
    rl: dict                    # the training cell's resolved rl settings (TrainConfig keys)
    lr: float
    eval_batch: int
    eval_cot: int
    eval_answer: int
    loglik_batch: int
    train_steps: int
    modes: tuple[str, ...]
    repeats: int

    @property
    def rows(self) -> int:
        return self.rl["prompts_per_step"] * self.rl["samples_per_prompt"]


def check_shape(config: dict, smoke: bool, modes: tuple[str, ...], steps: int | None, repeats: int | None,
                eval_cot: int | None = None) -> CheckShape:
    """The paper grid's llama-3b x math cell and its evaluation, from config.yaml (one home for
    the paper's numbers); --smoke keeps every setting but the sizes."""
    from softtokens.config import cell_rl

    grid = config["grids"]["paper"]
    rl = dict(cell_rl(config, "paper", PAPER_MODEL, PAPER_DATASET))
    ev = grid["evaluation"]
    model = grid["models"][PAPER_MODEL]
    if smoke:
        rl.update(SMOKE_SIZES)
        return CheckShape("smoke", rl, model["lr"], eval_batch=6, eval_cot=eval_cot or 8, eval_answer=4,
                          loglik_batch=4, train_steps=steps or 2, modes=modes, repeats=repeats or 1)
    return CheckShape(model["source"], rl, model["lr"], eval_batch=int(ev.get("batch_size", 64)),
                      eval_cot=eval_cot or int(ev["cot_max_tokens"]), eval_answer=int(ev["answer_max_tokens"]),
                      loglik_batch=int(ev.get("loglik_batch_size", 32)), train_steps=steps or 2, modes=modes,
                      repeats=repeats or 2)


# ---------------------------------------------------------------- results
@dataclass
class Report:
    """Every check's outcome and every measurement, written after each section."""

    out: Path
    meta: dict
    checks: list[dict] = field(default_factory=list)
    sections: dict = field(default_factory=dict)

    def check(self, section: str, name: str, passed: bool | None, value=None, expected=None, detail: str = "") -> bool:
        """passed None: not applicable here (e.g. CUDA graphs on a CPU); not counted."""
        self.checks.append({"section": section, "check": name, "passed": passed, "value": _plain(value),
                            "expected": expected, "detail": detail})
        mark = {True: "ok  ", False: "FAIL", None: "n/a "}[passed]
        print(f"[gpu-check] {mark} {section}: {name}: {_plain(value)}" + (f" ({expected})" if expected else ""),
              flush=True)
        return bool(passed)

    @property
    def passed(self) -> bool:
        return all(c["passed"] is not False for c in self.checks)

    def write(self) -> None:
        from softtokens.provenance import write_json

        self.out.mkdir(parents=True, exist_ok=True)
        failed = [f"{c['section']}: {c['check']}" for c in self.checks if c["passed"] is False]
        write_json(self.out / "gpu_check.json", {**self.meta, "passed": self.passed, "failed": failed,
                                                 "checks": self.checks, "sections": self.sections})
        (self.out / "gpu_check.md").write_text(self.summary())

    def summary(self) -> str:
        m = self.meta
        lines = [f"# gpu-check: {'PASSED' if self.passed else 'FAILED'}", "",
                 f"{m['device']['name']} · torch {m['torch']} (CUDA {m['cuda']}) · transformers {m['transformers']} · "
                 f"{m['model']} ({m['parameters'] / 1e9:.3g}B parameters, {m['compute_dtype']}) · {m['date']}", ""]
        eng = self.sections.get("engine", {}).get("settings", {})
        if eng:
            lines += ["| setting | ms / decode step | bound (ms) | × bound | CUDA graph |", "|---|---|---|---|---|"]
            lines += [f"| {k} | {v['ms_per_step']} | {v['bound_ms_per_step']} | {v['ratio_to_bound']} | "
                      f"{v['graph']} |" for k, v in eng.items()]
            lines.append("")
        for mode, t in self.sections.get("training", {}).get("modes", {}).items():
            steps = t.get("steps", [])
            if steps:
                last = steps[-1]
                lines.append(f"- training {mode}: step {last['seconds_step']} s (rollout {last['seconds_rollout']}, "
                             f"reward {last['seconds_reward']}, update {last['seconds_update']}); peak "
                             f"{t.get('memory', {}).get('measured_peak_GB')} GB, plan "
                             f"{t.get('memory', {}).get('planned_peak_GB')} GB")
        lines += ["", "| section | check | result | value | expected |", "|---|---|---|---|---|"]
        for c in self.checks:
            result = {True: "ok", False: "**FAIL**", None: "n/a"}[c["passed"]]
            lines.append(f"| {c['section']} | {c['check']} | {result} | {c['value']} | {c['expected'] or ''} |")
        return "\n".join(lines) + "\n"


def _plain(v):
    if isinstance(v, float):
        return round(v, 6) if math.isfinite(v) else str(v)
    if isinstance(v, torch.Tensor):
        return _plain(v.item()) if v.numel() == 1 else v.tolist()
    return v


# ---------------------------------------------------------------- the model under test
def check_tokenizer(vocab: int | None):
    """The toy BPE without whole-phrase tokens, so the paper's preamble splits into many tokens
    as a real tokenizer splits it (the engine's shared-prefix path runs), padded with added
    tokens to the architecture's vocabulary (the mixture and the head read all 128k rows)."""
    from softtokens.toybase import _segments

    rows = toy_splits(400, 1, 1, seed=0)["train"]
    tok = train_toy_tokenizer(["".join(_segments(r)) for r in rows], 384)
    if vocab and len(tok) < vocab:
        tok.add_tokens([f"<x{i}>" for i in range(vocab - len(tok))])
    return tok


def architecture_config(source: str) -> dict:
    from softtokens.plan import architecture_file

    if source == "smoke":
        return dict(SMOKE_ARCHITECTURE)
    fields = json.loads(architecture_file(source).read_text())
    return {k: v for k, v in fields.items() if not k.startswith("_")}


def random_model(fields: dict, tok, dtype: torch.dtype, device: torch.device):
    """A randomly initialised causal LM of the architecture, built on ``device`` directly (a 3B
    model initialised on a CPU takes minutes), whose special tokens are the tokenizer's."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(fields)
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    cfg.vocab_size = max(len(tok), cfg.vocab_size if fields.get("vocab_size") else 0)
    cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id = tok.pad_token_id, tok.eos_token_id, tok.bos_token_id
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.generation_config.eos_token_id = tok.eos_token_id
    return model.eval()


@torch.no_grad()
def peak_logits(model, tok, target: float = TARGET_ENTROPY) -> dict:
    """Scale the final norm's weight so the mean next-token entropy after a few prompts is
    ``target`` nats (module constant TARGET_ENTROPY): logits scale with that weight, so the factor
    is found by bisection on the logits of one forward. Returns the factor and both entropies."""
    from softtokens.modeling import decoder_hidden

    prompts = prompts_of(toy_splits(64, 1, 8, seed=9)["test"], 8)
    enc = tok(prompts, padding=True, return_tensors="pt").to(model.device)
    pos = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    h = decoder_hidden(model, input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], position_ids=pos)
    z = Float32Head(model, len(tok)).logits(h[:, -1])

    def entropy(c: float) -> float:
        return float(-(torch.softmax(c * z, -1) * torch.log_softmax(c * z, -1)).sum(-1).mean())

    lo, hi = -4.0, 6.0  # log10 of the factor; entropy falls as it grows
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if entropy(10 ** mid) > target else (lo, mid)
    factor = 10 ** ((lo + hi) / 2)
    before = entropy(1.0)
    model.get_decoder().norm.weight.mul_(factor)
    return {"final_norm_scale": round(factor, 4), "entropy_nats_before": round(before, 3),
            "entropy_nats": round(entropy(factor), 3), "target_entropy_nats": target}


def prompts_of(rows: list[dict], n: int, repeat: int = 1) -> list[str]:
    return [format_prompt(r["question"]) for r in rows[:n] for _ in range(repeat)]


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev: torch.device) -> float:
    _sync(dev)
    t = time.perf_counter()
    fn()
    _sync(dev)
    return time.perf_counter() - t


def copy_bandwidth(dev: torch.device) -> float:
    """Bytes per second of a device-to-device copy, reads and writes counted."""
    n = 2 ** 30 if dev.type == "cuda" else 2 ** 26
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = statistics.median(timed(lambda: dst.copy_(src), dev) for _ in range(5))
    del src, dst
    return 2 * n / seconds


def _reset_peak(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)


def _peak(dev: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None


def _allocated(dev: torch.device) -> float | None:
    return torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None


def _gb(x: float | None) -> float | None:
    return None if x is None else round(x / 1e9, 2)


def _free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- engine
def check_engine(report: Report, model, tok, shape: CheckShape, sigma: float, dev: torch.device) -> None:
    sec, out = "engine", {"settings": {}}
    report.sections[sec] = out
    rl = shape.rl
    rows = toy_splits(64, 1, 256, seed=5)["test"]
    prompts = prompts_of(rows, rl["prompts_per_step"], rl["samples_per_prompt"])  # a training step's B x G rows
    seeds = list(range(len(prompts)))
    cot, answer = rl["cot_max_tokens"], rl["answer_max_tokens"]
    engine = CotEngine(model, tok)
    bandwidth = copy_bandwidth(dev)
    cfg = model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    prompt_len = int(engine.encode_prompts(prompts)[1].sum(1).max())
    out.update(rows=len(prompts), cot=cot, answer=answer, prompt_tokens=prompt_len,
               copy_bandwidth_GBps=round(bandwidth / 1e9, 1), weights_GB=_gb(weight_bytes),
               attention=engine.attention, head=Float32Head(model, len(tok), with_input=True).path)
    for name, setting in INFERENCE_SETTINGS.items():
        engine.generate(prompts, setting, sigma, seeds, min(8, cot), 2)  # warm-up: allocator, capture
        steps = cot + engine.max_prefill + answer
        seconds = statistics.median(timed(lambda: engine.generate(prompts, setting, sigma, seeds, cot, answer), dev)
                                    for _ in range(shape.repeats))
        kv_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * len(prompts) \
            * (prompt_len + steps / 2) * model.dtype.itemsize  # the mean cache length a step must read
        mix_bytes = len(tok) * cfg.hidden_size * model.dtype.itemsize if setting.mode != "hard" else 0
        bound = (weight_bytes + kv_bytes + mix_bytes) / bandwidth
        out["settings"][name] = {"decode_steps": steps, "seconds_per_rollout": round(seconds, 3),
                                 "ms_per_step": round(1e3 * seconds / steps, 3),
                                 "bound_ms_per_step": round(1e3 * bound, 3),
                                 "ratio_to_bound": round(seconds / steps / bound, 2), "graph": engine.graph_status}
        report.check(sec, f"{name}: decode step captured in a CUDA graph",
                     engine.graph_status == "captured" if dev.type == "cuda" else None, engine.graph_status)
        print(f"[gpu-check] engine {name}: {out['settings'][name]}", flush=True)
        report.write()

    _greedy_equals_hf(report, model, tok, rows, dev)
    short = min(cot, 32)
    if dev.type == "cuda":  # the captured step against the same step run eagerly, bit for bit
        eager = CotEngine(model, tok, cuda_graphs=False)
        for name in ("hard_sample", "soft_sample", "fuzzy_sample"):
            a = engine.generate(prompts, INFERENCE_SETTINGS[name], sigma, seeds, short, 4, answer_temperature=1.0)
            b = eager.generate(prompts, INFERENCE_SETTINGS[name], sigma, seeds, short, 4, answer_temperature=1.0)
            same = torch.equal(a.step_ids, b.step_ids) and (a.noisy_inputs is None
                                                             or torch.equal(a.noisy_inputs, b.noisy_inputs))
            report.check(sec, f"{name}: CUDA-graph replay equals the eager step", same,
                         "identical" if same else "differs", "bit for bit")
    else:
        report.check(sec, "CUDA-graph replay equals the eager step", None, "no CUDA device")
    _noise_is_fresh(report, engine, prompts, seeds, sigma, short, dev)
    if dev.type == "cuda":  # where a decode step's time goes, for whoever speeds it up next
        from torch.profiler import ProfilerActivity, profile

        cot_p = min(cot, 128)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.generate(prompts, INFERENCE_SETTINGS["soft_sample"], sigma, seeds, cot_p, 2)
        out["profile"] = {"setting": "soft_sample", "cot": cot_p, "answer": 2,
                          "table": prof.key_averages().table(sort_by="cuda_time_total", row_limit=25,
                                                             max_name_column_width=70)}
    report.write()


@torch.no_grad()
def _greedy_equals_hf(report: Report, model, tok, rows, dev) -> None:
    """Hard greedy CoT tokens against HF generate(do_sample=False) on the same prompts: in float32
    (pass/fail: the same tokens), and in the compute dtype (reported: HF rounds its logits to bf16,
    where ties among 128k tokens are common, so a divergence there says nothing of the engine)."""
    import copy

    sec = "engine"
    prompts = prompts_of(rows, 8)
    k = 24
    for dtype in (torch.float32, model.dtype):
        m = model if dtype == model.dtype else copy.deepcopy(model).to(dtype)
        engine = CotEngine(m, tok)
        ids, mask = engine.encode_prompts(prompts)
        eos, m.generation_config.eos_token_id = m.generation_config.eos_token_id, None  # k tokens, as the CoT
        hf = m.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=k,
                        pad_token_id=tok.pad_token_id)[:, ids.shape[1]:]
        m.generation_config.eos_token_id = eos
        ours = engine.generate(prompts, INFERENCE_SETTINGS["hard_greedy"], 0.0, list(range(len(prompts))), k, 1)
        ours_ids = ours.step_ids[:, :k]
        agree = (hf == ours_ids).float().cumprod(-1).sum(-1)  # tokens equal before the first difference
        share = float(agree.sum() / agree.numel() / k)
        if dtype == torch.float32:
            report.check(sec, "hard greedy tokens equal HF generate (float32)", share == 1.0, round(share, 4),
                         "1.0: every token of every row")
        else:
            report.sections[sec]["hf_generate_agreement_compute_dtype"] = round(share, 4)
            report.check(sec, f"hard greedy tokens vs HF generate ({str(dtype).removeprefix('torch.')}, "
                              "HF rounds logits to it)", None, round(share, 4), "reported")
        if m is not model:
            del m
            _free(dev)


@torch.no_grad()
def _noise_is_fresh(report: Report, engine: CotEngine, prompts, seeds, sigma: float, cot: int, dev) -> None:
    """Soft CoT noise as the model saw it: equal across two runs with the same seeds, different
    with other seeds, and, recovered from a teacher-forced replay (noise = (h~ - h0) / sigma), of
    unit variance per dimension and uncorrelated across a row's steps and across rows at a step.
    A noise draw frozen by graph replay (the same vector at every step) fails the last two."""
    from softtokens.generation import COT
    from softtokens.rloo import step_hidden

    sec, setting = "engine", INFERENCE_SETTINGS["soft_sample"]
    a = engine.generate(prompts, setting, sigma, seeds, cot, 2)
    b = engine.generate(prompts, setting, sigma, seeds, cot, 2)
    c = engine.generate(prompts, setting, sigma, [s + 10_000 for s in seeds], cot, 2)
    report.check(sec, "soft_sample: the same seeds give the same inputs", torch.equal(a.noisy_inputs, b.noisy_inputs),
                 "identical" if torch.equal(a.noisy_inputs, b.noisy_inputs) else "differ", "bit for bit")
    report.check(sec, "soft_sample: other seeds give other inputs", not torch.equal(a.noisy_inputs, c.noisy_inputs),
                 "differ" if not torch.equal(a.noisy_inputs, c.noisy_inputs) else "identical", "differ")
    model = engine.model
    head = Float32Head(model, engine.vocab_rows, with_input=True)
    h = step_hidden(model, a)  # (N, S, d)
    is_cot = a.step_phase == COT
    steps = int(is_cot.sum(1).min())
    noise, agree = [], []
    for t in range(steps):
        logits = head.logits(h[:, t])
        agree.append(logits.argmax(-1) == a.argmax_ids[:, t])  # bf16 flips a near tie's argmax now and then
        p = torch.softmax(logits / setting.temperature, dim=-1)
        noise.append((a.noisy_inputs[:, t] - head.mixture(p)) / sigma)
    n = torch.stack(noise, dim=1)  # (N, T, d)
    agree = torch.stack(agree, dim=1)  # (N, T)
    d = n.shape[-1]
    energy = float(n.pow(2).mean(-1)[agree].mean())  # where the replay's argmax is the rollout's, as the residual
    unit = torch.nn.functional.normalize(n, dim=-1)
    along = float((unit[:, 1:] * unit[:, :-1]).sum(-1).abs().mean()) if steps > 1 else 0.0
    across = float((unit[1:] * unit[:-1]).sum(-1).abs().mean())
    bound = min(0.5, TIE_THRESHOLD_SCALE / math.sqrt(d))
    report.sections[sec]["noise"] = {"energy_per_dim": round(energy, 4), "argmax_flips": round(1 - float(
                                         agree.float().mean()), 4), "mean_abs_cos_consecutive_steps": round(along, 4),
                                     "mean_abs_cos_across_rows": round(across, 4), "fresh_noise_expected_abs_cos":
                                     round(math.sqrt(2 / (math.pi * d)), 4), "steps": steps}
    report.check(sec, "soft_sample: replayed noise has unit variance per dimension", 0.8 <= energy <= 1.25,
                 round(energy, 3), "0.8 to 1.25, at steps whose replayed argmax is the rollout's")
    report.check(sec, "soft_sample: noise fresh at every step (|cos| of consecutive steps)", along < bound,
                 round(along, 4), f"< {bound:.3f}; frozen noise gives ~1")
    report.check(sec, "soft_sample: noise fresh in every row (|cos| across rows)", across < bound,
                 round(across, 4), f"< {bound:.3f}")


# ---------------------------------------------------------------- evaluation
@torch.no_grad()
def check_evaluation(report: Report, model, tok, shape: CheckShape, arch, sigma: float, dev: torch.device) -> None:
    from softtokens.loglik import score_rows
    from softtokens.plan import eval_memory, loglik_memory

    sec, out = "evaluation", {"settings": {}}
    report.sections[sec] = out
    rows = toy_splits(64, 1, shape.eval_batch, seed=6)["test"]
    prompts = prompts_of(rows, shape.eval_batch)
    engine = CotEngine(model, tok)
    prompt_len = max(len(x) for x in tok(prompts)["input_ids"])
    peak = 0.0
    for name, setting in INFERENCE_SETTINGS.items():
        _reset_peak(dev)
        t0 = time.perf_counter()
        finished = list(engine.stream(prompts, list(range(len(prompts))), setting, sigma, shape.eval_cot,
                                      shape.eval_answer, batch_size=shape.eval_batch))
        _sync(dev)
        seconds = time.perf_counter() - t0
        stats = dict(engine.stream_stats)
        peak = max(peak, _peak(dev) or 0.0)
        out["settings"][name] = {"rows": len(finished), "seconds": round(seconds, 2),
                                 "ms_per_step": round(1e3 * seconds / max(1, stats["decode_steps"]), 3),
                                 "peak_GB": _gb(_peak(dev)), "graph": engine.graph_status, **stats}
        report.check(sec, f"{name}: a batch of {shape.eval_batch} rows decodes", len(finished) == len(prompts),
                     f"{len(finished)} rows, {seconds:.1f} s", f"{len(prompts)} rows")
        report.write()
    plan = eval_memory(arch, shape.eval_batch, prompt_len, shape.eval_cot, shape.eval_answer,
                       str(model.dtype).removeprefix("torch."))
    _memory_check(report, sec, "evaluation peak memory", peak if dev.type == "cuda" else None, plan["peak"],
                  {k: _gb(v) for k, v in plan.items()})
    out["memory"] = {"measured_peak_GB": _gb(peak) if dev.type == "cuda" else None, "planned_GB": _gb(plan["peak"])}

    mc = toy_choice_rows(max(8, shape.loglik_batch), seed=3)
    _reset_peak(dev)
    t0 = time.perf_counter()
    scored = score_rows(model, tok, mc, batch_size=shape.loglik_batch)
    seconds = time.perf_counter() - t0
    finite = all(math.isfinite(s["nll_correct"]) for s in scored)
    context = max(len(x) for x in tok([r["context"] for r in mc])["input_ids"])
    lplan = loglik_memory(arch, shape.loglik_batch, context, compute_dtype=str(model.dtype).removeprefix("torch."))
    out["loglik"] = {"rows": len(scored), "seconds": round(seconds, 2), "peak_GB": _gb(_peak(dev)),
                     "planned_GB": _gb(lplan["peak"])}
    report.check(sec, "out-of-domain scorer: every row scored, finite NLL", finite and len(scored) == len(mc),
                 f"{len(scored)} rows, {seconds:.1f} s")
    report.write()


def _memory_check(report: Report, sec: str, name: str, measured: float | None, planned: float, terms: dict) -> None:
    if measured is None:
        report.check(sec, f"{name} vs plan", None, "no CUDA device", f"within {PLAN_TOLERANCE:.0%}")
        return
    ratio = measured / planned
    report.check(sec, f"{name} vs plan", abs(ratio - 1) <= PLAN_TOLERANCE,
                 f"{measured / 1e9:.2f} GB measured, {planned / 1e9:.2f} GB planned ({ratio:.2f}x)",
                 f"within {PLAN_TOLERANCE:.0%}", detail=json.dumps(terms))


# ---------------------------------------------------------------- training
def synthetic_grade(completion: str, gold: str, timeout_s: float | None = None):
    """A stand-in for the math-verify reward on random weights: a completion's hash picks its grade
    (a third correct, a third boxed but wrong, a third unboxed), so a group's rewards vary and
    RLOO has a gradient. Deterministic, and no math-verify needed."""
    from softtokens.rewards import Grade

    k = int.from_bytes(hashlib.sha256((completion + "|" + gold).encode()).digest()[:4], "little") % 3
    return Grade(boxed=k < 2, correct=k == 0)


def save_base(model, tok, work: Path) -> Path:
    """The random model as a training job's base directory (then the caller releases it: the
    trainer loads its own master and rollout copies, as a training job does)."""
    base = work / "base"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    return base


def check_training(report: Report, base: Path, shape: CheckShape, arch, dev: torch.device, work: Path) -> None:
    """RLOO steps of the cell in each of ``shape.modes`` from the base at ``base``."""
    sec, out = "training", {"modes": {}}
    report.sections[sec] = out
    rows = toy_splits(64, 4, 1, seed=7)
    for i, mode in enumerate(shape.modes):
        out["modes"][mode] = result = {}
        try:
            _train_mode(report, result, base, rows, shape, arch, mode, dev, work / f"state-{mode}",
                        master_check=(i == 0))
        except Exception as err:  # one mode's failure must not hide the others' results
            report.check(sec, f"{mode}: RLOO steps run", False, f"{type(err).__name__}: {err}",
                         detail=traceback.format_exc(limit=8))
        finally:
            _free(dev)
        report.write()


def _train_mode(report, result, base: Path, rows, shape: CheckShape, arch, mode: str, dev, state_dir: Path,
                master_check: bool) -> None:
    from transformers import AutoModelForCausalLM

    from softtokens.plan import TrainJob, train_memory
    from softtokens.sharding import full_state_dict, load_optimizer, optimizer_state_tensors, save_optimizer
    from softtokens.training import TrainConfig, Trainer

    sec = "training"
    settings = {**shape.rl, "mode": mode, "seed": 0, "lr": shape.lr, "resume_save_minutes": 1e9,
                # judged here against the paper grid's bounds instead of stopping the step
                "replay_residual_max": math.inf, "replay_argmax_mismatch_max": 1.0}
    cfg = TrainConfig.from_settings(settings)
    bounds = TrainConfig.from_settings({**shape.rl, "mode": mode, "seed": 0, "lr": shape.lr})
    phases: dict[str, float] = {}

    class MeasuredTrainer(Trainer):
        def rollouts(self, step):
            _reset_peak(dev)
            got = super().rollouts(step)
            phases["rollout"] = _peak(dev) or 0.0
            _reset_peak(dev)
            return got

    t0 = time.perf_counter()
    trainer = MeasuredTrainer(cfg, str(base), rows["train"], rows["validation"], state_dir, grader=synthetic_grade)
    result["seconds_load"] = round(time.perf_counter() - t0, 1)
    result["processes"] = trainer.dp.world
    before = {k: v.clone() for k, v in full_state_dict(trainer.policy).items()} if master_check else None
    steps = result["steps"] = []
    prompt_len, held = 0, None
    for step in range(shape.train_steps):
        held = _allocated(dev)
        row = trainer.train_step(step)
        _sync(dev)
        phases["update"] = _peak(dev) or 0.0
        prompt_len = max(prompt_len, int(trainer.engine.encode_prompts(
            [format_prompt(p["question"]) for p in trainer.prompts_for_step(step)])[1].sum(1).max()))
        steps.append({k: row[k] for k in ("seconds_rollout", "seconds_reward", "seconds_update", "reward",
                                          "reward_std", "grad_norm", "entropy", "replay_residual",
                                          "replay_argmax_mismatch", "replay_argmax_flips", "replay_flip_gap_max",
                                          "completions/mean_length")}
                     | {"seconds_step": round(row["seconds_rollout"] + row["seconds_reward"] + row["seconds_update"], 3),
                        "held_GB": _gb(held), "rollout_peak_GB": _gb(phases.get("rollout")),
                        "update_peak_GB": _gb(phases.get("update")),
                        "reserved_peak_GB": _gb(torch.cuda.max_memory_reserved(dev)) if dev.type == "cuda" else None})
        print(f"[gpu-check] training {mode} step {step + 1}: {steps[-1]}", flush=True)
    last = steps[-1]
    report.check(sec, f"{mode}: {len(steps)} RLOO steps run", True,
                 f"{last['seconds_step']} s/step (rollout {last['seconds_rollout']}, update {last['seconds_update']})")
    if mode != "hard":
        residual = last["replay_residual"]
        report.check(sec, f"{mode}: replay residual", residual is not None and residual <= bounds.replay_residual_max,
                     residual, f"<= {bounds.replay_residual_max} (rl.replay_residual_max)")
    mismatch = max(s["replay_argmax_mismatch"] for s in steps)
    report.check(sec, f"{mode}: replay argmax mismatch (> {bounds.replay_logit_tolerance} nat)",
                 mismatch <= bounds.replay_argmax_mismatch_max, mismatch,
                 f"<= {bounds.replay_argmax_mismatch_max} (rl.replay_argmax_mismatch_max)")
    flips, gap = max(s["replay_argmax_flips"] for s in steps), max(s["replay_flip_gap_max"] for s in steps)
    report.check(sec, f"{mode}: replay argmax flips at near ties (bf16 noise)", None,
                 f"{flips:.4f} of CoT steps, largest gap {gap:.3f} nats", "reported")

    # memory: the last step (AdamW's state exists from the first update on) beside the plan
    job = TrainJob(processes=trainer.dp.world, rows=shape.rows, micro_batch=cfg.micro_batch_size,
                   prompt_tokens=prompt_len, cot_tokens=cfg.cot_max_tokens, answer_tokens=cfg.answer_max_tokens,
                   continuous=mode != "hard", param_dtype=cfg.param_dtype, compute_dtype=cfg.compute_dtype,
                   checkpointing=cfg.activation_checkpointing)
    plan = train_memory(arch, job)
    planned_held = plan["master weights"] + plan["optimizer state"] + plan["rollout weights"]
    planned = {"held": planned_held,
               "rollout": planned_held + plan["kv cache"] + plan["decode transients"] + plan["soft inputs"]
               + plan["row noise"],
               "update": planned_held + plan["gradients"] + plan["soft inputs"] + plan["activations"] + plan["logits"]
               + plan["gathered weights"]}
    measured = {"held": held, "rollout": phases.get("rollout"), "update": phases.get("update")} \
        if dev.type == "cuda" else {}
    result["memory"] = {"planned_GB": {k: _gb(v) for k, v in planned.items()},
                        "measured_GB": {k: _gb(v) for k, v in measured.items()},
                        "plan_terms_GB": {k: _gb(v) for k, v in plan.items()},
                        "measured_peak_GB": _gb(max(measured.values())) if measured else None,
                        "planned_peak_GB": _gb(plan["peak"])}
    for phase in ("held", "rollout", "update"):
        _memory_check(report, sec, f"{mode}: {phase} memory per GPU", measured.get(phase), planned[phase],
                      {k: _gb(v) for k, v in plan.items()})

    if master_check:
        after = full_state_dict(trainer.policy)
        moved = {k: float((after[k] != before[k]).float().mean()) for k in after if after[k].is_floating_point()}
        total = sum(after[k].numel() for k in moved)
        share = sum(moved[k] * after[k].numel() for k in moved) / total
        worst = min(moved, key=moved.get)
        result["master_moved"] = {"share": share, "least_moved": worst, "least_share": moved[worst]}
        report.check(sec, f"{mode}: float32 master entries moved by {len(steps)} AdamW steps", share >= MOVED_MIN,
                     round(share, 5), f">= {MOVED_MIN} (least: {worst} {moved[worst]:.4f})")
        del before

        # the checkpoint a run writes, loaded the way a user loads it
        t0 = time.perf_counter()
        trainer._save("best", len(steps), with_optimizer=False)
        saved = state_dir / "best"
        result["seconds_save"] = round(time.perf_counter() - t0, 1)
        if trainer.dp.is_main:
            plain = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
            same = all(torch.equal(v, after[k]) for k, v in plain.state_dict().items() if k in after)
            report.check(sec, f"{mode}: checkpoint reloads with plain from_pretrained, master weights equal", same,
                         "equal" if same else "differ", "bit for bit")
            del plain
            # as evaluation loads a checkpoint (modeling.load_model): from_pretrained in the compute dtype
            plain = AutoModelForCausalLM.from_pretrained(saved, dtype=trainer.rollout_model.dtype).to(dev).eval()
            ids = trainer.engine.encode_prompts(prompts_of(rows["train"], 4))
            with torch.no_grad():
                got = plain(input_ids=ids[0], attention_mask=ids[1]).logits.float()
                ref = trainer.rollout_model(input_ids=ids[0], attention_mask=ids[1]).logits.float()
            diff = float((got - ref).abs().max())
            report.check(sec, f"{mode}: reloaded checkpoint's logits equal the rollout copy's", diff == 0.0, diff,
                         "0 (both are the bf16 rounding of the same master)")
            del plain, got, ref
        del after
        # the sharded AdamW state: saved and loaded back with torch.distributed.checkpoint
        t0 = time.perf_counter()
        path = state_dir / "optimizer-check"
        save_optimizer(trainer.policy, trainer.opt, path)
        kept = [t.detach().clone() for t in optimizer_state_tensors(trainer.opt)[:4]]
        for t in optimizer_state_tensors(trainer.opt)[:4]:
            t.zero_()
        load_optimizer(trainer.policy, trainer.opt, path)
        back = optimizer_state_tensors(trainer.opt)[:4]
        same = len(kept) > 0 and all(torch.equal(a.full_tensor() if hasattr(a, "full_tensor") else a,
                                                 b.full_tensor() if hasattr(b, "full_tensor") else b)
                                     for a, b in zip(kept, back))
        result["seconds_optimizer_round_trip"] = round(time.perf_counter() - t0, 1)
        report.check(sec, f"{mode}: sharded optimizer state saved and loaded (torch.distributed.checkpoint)", same,
                     f"{'equal' if same else 'differ'}, {result['seconds_optimizer_round_trip']} s")
    trainer.close()
    del trainer
    shutil.rmtree(state_dir, ignore_errors=True)


# ---------------------------------------------------------------- the command
def run_gpu_check(out: Path, config: dict, smoke: bool = False, sections: tuple[str, ...] = SECTIONS,
                  modes: tuple[str, ...] = ("soft",), steps: int | None = None, repeats: int | None = None,
                  work_dir: Path | None = None, eval_cot: int | None = None, device: str | None = None) -> Report:
    import transformers

    from softtokens.plan import _from_config_json

    shape = check_shape(config, smoke, modes, steps, repeats, eval_cot)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        dev = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
        torch.cuda.set_device(dev)
    dtype = DTYPES[shape.rl["compute_dtype"]]
    fields = architecture_config(shape.source)
    tok = check_tokenizer(fields.get("vocab_size"))
    model = random_model(fields, tok, dtype, dev)
    peaked = peak_logits(model, tok)
    arch = _from_config_json(json.dumps({**fields, "vocab_size": model.config.vocab_size}), shape.source)
    sigma = embedding_scale(model, len(tok)).sigma(shape.rl["noise_factor"])
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "smoke": smoke,
            "device": {"type": dev.type, "name": torch.cuda.get_device_name(dev) if dev.type == "cuda"
                       else platform.processor() or platform.machine(),
                       "count": torch.cuda.device_count() if dev.type == "cuda" else 0,
                       "memory_GB": _gb(torch.cuda.get_device_properties(dev).total_memory) if dev.type == "cuda"
                       else None},
            "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "model": shape.source, "parameters": sum(p.numel() for p in model.parameters()),
            "compute_dtype": shape.rl["compute_dtype"], "sigma": sigma, "random_model": peaked,
            "shape": {k: v for k, v in asdict(shape).items() if k != "rl"} | {
                k: shape.rl[k] for k in ("prompts_per_step", "samples_per_prompt", "cot_max_tokens",
                                         "answer_max_tokens", "micro_batch_size", "activation_checkpointing",
                                         "param_dtype", "compute_dtype")},
            "env": {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES")}}
    report = Report(Path(out), meta)
    report.write()
    started = time.perf_counter()
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(sorted(unknown))} (known: {', '.join(SECTIONS)})")
    work = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=work_dir))
    try:
        for name in [s for s in SECTIONS if s in sections]:  # training last: it releases the model
            t0 = time.perf_counter()
            try:
                if name == "engine":
                    check_engine(report, model, tok, shape, sigma, dev)
                elif name == "evaluation":
                    check_evaluation(report, model, tok, shape, arch, sigma, dev)
                else:
                    base = save_base(model, tok, work)
                    model = None
                    _free(dev)
                    check_training(report, base, shape, arch, dev, work)
            except Exception as err:
                report.check(name, "section ran", False, f"{type(err).__name__}: {err}",
                             detail=traceback.format_exc(limit=12))
            report.sections.setdefault(name, {})["seconds"] = round(time.perf_counter() - t0, 1)
            report.write()
            _free(dev)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.meta["seconds"] = round(time.perf_counter() - started, 1)
    report.write()
    return report
