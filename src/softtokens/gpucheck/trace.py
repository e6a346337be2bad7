"""What a GPU would hold, measured without one: each phase of a training or evaluation job run through the
project's own code under PyTorch's FakeTensorMode (shapes and dtypes, no data, no arithmetic) with torch's
MemTracker counting every tensor alive, the job's processes a fake process group (rank 0: the largest FSDP2 shard).

Why: the memory plan (sizing.plan) is hand formulas, and a GPU minute is rare. The trace follows a GPU's paths
where the code chooses by device: the head's bf16 GEMMs write float32 results (model.head.fused_wide_matmul
answers as on CUDA), the decode runs with fixed shapes. What it cannot see is named, not hidden: CUDA kernels'
workspaces, NCCL buffers and the allocator's fragmentation (sizing.plan.USABLE_SHARE keeps room for them).

Each phase is read at its own peak: held (master shard, AdamW's state at a later step, the rollout copy), the
rollout (B x G / P rows decoded with their soft inputs recorded), the update (every micro-batch of a process, the
gradients of the earlier ones held), the optimizer step, greedy validation, a staged save (one tensor gathered at a
time), an evaluation decode and a log-likelihood batch. A phase is driven as far as its first host read of a
device value (fake tensors hold none): the loop's bookkeeping after a decode step, not its memory.
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.distributed._tools.mem_tracker import MemTracker

from softtokens.config.names import setting_name
from softtokens.data.prompt import PREFILL_TOKENS, PROMPT_HEAD, format_prompt

DECODE_STEPS = 2      # decode steps traced per decode phase: the cache is preallocated, a step's transients repeat


class PhaseTracker(MemTracker):
    """torch's MemTracker, read phase by phase, counting every tensor alive at dispatch as it does. Its module
    statistics (per-module snapshots, which nothing here reads) are left out: they refuse a job's normal course,
    a model called again in a new iteration (every decode step, every micro-batch) and a module whose parameters
    need no gradient (the decoding copy). A module's parameters, buffers and gradients are still attributed as
    they first run."""

    def _pre_fw_hook(self, module, inputs) -> None:
        self._track_module_params_and_buffers(module, all(p.requires_grad for p in module.parameters()))

    def _post_fw_hook(self, module, inputs, outputs) -> None:
        pass

    def _pre_bw_hook(self, module, args) -> None:
        pass

    def _post_bw_hook(self, module, args) -> None:
        pass

    def start_phase(self) -> None:
        """The next peak read is this phase's alone (MemTracker keeps one peak per tracker)."""
        from torch.distributed._tools.mem_tracker import _ModState

        self._peak_mem, self._peak_mem_snap = {}, {}
        self._update_peak_stats(_ModState.PEAK_FW)

    def peak(self) -> dict[str, int]:
        """{kind: bytes} at this phase's peak (parameters, gradients, optimizer state, activations, temporaries,
        Total), over every device."""
        return _summed(self.get_tracker_snapshot("peak"))

    def current(self) -> dict[str, int]:
        return _summed(self.get_tracker_snapshot("current"))


def _summed(snapshot: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for per_device in snapshot.values():
        for kind, n in per_device.items():
            key = getattr(kind, "value", str(kind))
            out[key] = out.get(key, 0) + int(n)
    return out


@contextlib.contextmanager
def fake_world(processes: int):
    """A fake process group of ``processes`` ranks (this process rank 0) and its CPU mesh, made outside the fake
    mode (the mesh reads its ranks)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=processes, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (processes,))
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def gpu_head():
    """The head's bf16 GEMMs write float32 results, as on a GPU (model.head.fused_wide_matmul): a CPU has no
    such kernel, fake tensors only need its shapes."""
    from softtokens.model import head

    before = dict(head._FUSED_OK)
    head._FUSED_OK["cpu"] = True
    try:
        yield
    finally:
        head._FUSED_OK.clear()
        head._FUSED_OK.update(before)


def architecture_fields(source: str, layers: int) -> dict:
    """A shipped architecture's config.json fields (gpucheck.models.architecture_config) at ``layers`` decoder
    layers."""
    from softtokens.gpucheck.models import architecture_config

    return {**architecture_config(source), "num_hidden_layers": layers}


@dataclass(frozen=True)
class TraceShape:
    """A job's shape as the plan reads it (sizing.plan.TrainJob; evaluation: rows are its batch)."""
    rows: int                 # rows a process decodes (training: B x G / P)
    group: int                # rows that share a prompt (G in training; 1 in evaluation)
    prompt_tokens: int
    cot_tokens: int
    answer_tokens: int
    micro_batch: int = 0
    val_rows: int = 0
    val_cot_tokens: int = 0


def _model(fields: dict, tok, dtype: torch.dtype, grad: bool):
    """gpucheck.models.random_model under the fake mode (shapes only), its parameters needing gradients or not."""
    from softtokens.gpucheck.models import random_model

    return random_model(fields, tok, dtype, torch.device("cpu")).requires_grad_(grad)


def prompt_batch(tok, rows: int, group: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Host tensors of ``rows`` prompts ``width`` tokens wide (the plan's prompt length, no padding), every prompt
    opening with the paper's instruction (the engine's shared prefix) and ``group`` rows to a prompt."""
    head = tok(PROMPT_HEAD, add_special_tokens=False)["input_ids"]
    body = tok(format_prompt("What is 12 plus 30?"), add_special_tokens=False)["input_ids"][len(head):]
    ids, vocab = [], len(tok)   # len() of a tokenizer with added tokens counts them every call
    for r in range(-(-rows // group)):
        filler = [(7 * r + 11 * j) % (vocab - 1) + 1 for j in range(width)]
        row = (head + filler)[: width - len(body)] + body
        ids += [row] * group
    with unset_fake_temporarily():   # host tensors: the engine reads them on the host
        ids = torch.tensor(ids[:rows], dtype=torch.long)
        return ids, torch.ones_like(ids)


def trace_decode(tracker: PhaseTracker, engine, setting, sigma: float, shape: TraceShape, rows: int, cot: int,
                 record_inputs: bool, group: int = 1) -> dict[str, int]:
    """One decode phase's peak: engine.decode_run.DecodeRun over ``rows`` slots, the prompts admitted (their
    prefill; ``group`` rows to a prompt), DECODE_STEPS steps."""
    from softtokens.engine.decode_run import DecodeRun

    ids, mask = prompt_batch(engine.tokenizer, rows, group, shape.prompt_tokens)
    shared = engine.shared_tokens(ids.tolist())
    tracker.start_phase()
    with torch.no_grad():
        run = DecodeRun(engine, setting, sigma, cot, shape.answer_tokens, 1.0, slots=rows, max_prompt=ids.shape[1],
                        record_inputs=record_inputs, shared=shared)
        run.admit(list(range(rows)), ids, mask, list(range(rows)))
        run.steps(DECODE_STEPS)
        peak = tracker.peak()
        del run
    return peak


def trace_training(fields: dict, shape: TraceShape, processes: int, mode: str, compute_dtype: str = "bfloat16",
                   param_dtype: str = "float32", checkpointing: bool = False, optimizer: str = "fused",
                   tok=None) -> dict[str, dict[str, int]]:
    """{phase: {kind: bytes}} of rank 0 of a training job (module docstring), at a later step (AdamW's state
    allocated by a first one)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from softtokens.engine.cot import CotEngine
    from softtokens.engine.settings import INFERENCE_SETTINGS
    from softtokens.gpucheck.head_check import synthetic_rollout
    from softtokens.gpucheck.models import check_tokenizer
    from softtokens.train.optimizer import adamw
    from softtokens.train.sharding import shard_policy, staged_weights
    from softtokens.train.update import accumulate_gradients

    tok = tok or check_tokenizer(fields["vocab_size"])
    setting = INFERENCE_SETTINGS[setting_name(mode, "sample")]
    greedy = INFERENCE_SETTINGS[setting_name(mode, "greedy")]   # the run's mode without noise (TrainConfig)
    steps = shape.cot_tokens + PREFILL_TOKENS + shape.answer_tokens   # a row's steps at most (DecodeRun.max_steps)
    cfg = types.SimpleNamespace(micro_batch_size=shape.micro_batch, answer_temperature=1.0, replay_logit_tolerance=0.0)
    out: dict[str, dict[str, int]] = {}
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    with fake_world(processes) as mesh, gpu_head(), FakeTensorMode(allow_non_fake_inputs=True):
        master = _model(fields, tok, dtypes[param_dtype], grad=True)
        # the rollout copy: the model in the compute dtype (train.sharding.rollout_copy's deepcopy cannot run
        # under fake tensors; this is its result)
        plain = _model(fields, tok, dtypes[compute_dtype], grad=False)
        policy = shard_policy(master, mesh, compute_dtype, param_dtype, checkpointing)
        opt, _ = adamw(policy.parameters(), 1e-6, (0.9, 0.999), 1e-8, 0.0, optimizer)
        engine = CotEngine(plain, tok, fixed_shapes=True, cuda_graphs=False)
        tracker = PhaseTracker()
        tracker.track_external(policy, opt, plain)
        with tracker:
            adv = torch.linspace(-1.0, 1.0, shape.rows)
            for step in range(2):   # the first allocates AdamW's state; the second is a later step
                if step:
                    tracker.start_phase()
                    out["held"] = tracker.current()
                    out["rollout"] = trace_decode(tracker, engine, setting, 0.02 if mode != "hard" else 0.0, shape,
                                                  shape.rows, shape.cot_tokens, record_inputs=True,
                                                  group=shape.group)
                rollout = synthetic_rollout(setting, shape.rows, shape.prompt_tokens, steps, fields["vocab_size"],
                                            fields["hidden_size"], torch.device("cpu"))
                tracker.start_phase()
                accumulate_gradients(policy, rollout, adv, shape.rows * processes, cfg, 0.02, fields["vocab_size"], 1.0)
                if step:
                    out["update"] = tracker.peak()
                del rollout
                tracker.start_phase()
                opt.step()
                if step:
                    out["optimizer step"] = tracker.peak()
                opt.zero_grad(set_to_none=True)
            out["validation"] = trace_decode(tracker, engine, greedy, 0.0, shape, shape.val_rows or shape.rows,
                                             shape.val_cot_tokens or shape.cot_tokens, record_inputs=False)
            tracker.start_phase()
            out["staged save"] = _trace_staged_save(tracker, policy, staged_weights)
    return out


def _trace_staged_save(tracker: PhaseTracker, policy, staged_weights) -> dict[str, int]:
    """A staged save's peak on the device: train.sharding.staged_weights gathers one tensor at a time
    (torch.distributed.checkpoint's state-dict walk) and moves it to the host. On a CPU trace the host is the
    device, so each gathered tensor is dropped once the walk hands it back (its host copy is host memory,
    sizing.host, not the GPU's): the peak read is the device's."""
    import torch.distributed._state_dict_utils as walk
    from torch.distributed.tensor import DTensor

    iterate = walk._iterate_state_dict

    def gathered_then_dropped(obj, *a, **k):
        out = iterate(obj, *a, **k)
        return torch.empty(0, dtype=out.dtype) if isinstance(obj, DTensor) and isinstance(out, torch.Tensor) else out

    walk._iterate_state_dict = gathered_then_dropped
    try:
        staged_weights(policy)
    finally:
        walk._iterate_state_dict = iterate
    return tracker.peak()


def trace_evaluation(fields: dict, shape: TraceShape, mode: str = "soft", compute_dtype: str = "bfloat16",
                     tok=None) -> dict[str, dict[str, int]]:
    """{"evaluate": {kind: bytes}}: the model in the compute dtype decoding ``shape.rows`` rows at once in a
    continuous setting (the mixture's transients; the six settings' largest)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from softtokens.engine.cot import CotEngine
    from softtokens.engine.settings import INFERENCE_SETTINGS
    from softtokens.gpucheck.models import check_tokenizer

    tok = tok or check_tokenizer(fields["vocab_size"])
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    with gpu_head(), FakeTensorMode(allow_non_fake_inputs=True):
        model = _model(fields, tok, dtypes[compute_dtype], grad=False)
        engine = CotEngine(model, tok, fixed_shapes=True, cuda_graphs=False)
        tracker = PhaseTracker()
        tracker.track_external(model)
        with tracker:
            peak = trace_decode(tracker, engine, INFERENCE_SETTINGS[setting_name(mode, "sample")], 0.02, shape, shape.rows,
                                shape.cot_tokens, record_inputs=False)
    return {"evaluate": peak}


def trace_loglik(fields: dict, batch: int, context_tokens: int, choice_tokens: int, compute_dtype: str = "bfloat16",
                 tok=None) -> dict[str, dict[str, int]]:
    """{"loglik": {kind: bytes}}: eval.loglik.continuation_log_likelihoods on ``batch`` requests of
    ``context_tokens + choice_tokens`` tokens, up to its first host read (the scores' sum)."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    from softtokens.eval.loglik import continuation_log_likelihoods
    from softtokens.gpucheck.models import check_tokenizer

    tok = tok or check_tokenizer(fields["vocab_size"])
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    width, vocab = context_tokens + choice_tokens, len(tok)
    requests = [(i, 0, [(5 * i + j) % (vocab - 1) + 1 for j in range(width + 1)], choice_tokens)
                for i in range(batch)]
    with gpu_head(), FakeTensorMode(allow_non_fake_inputs=True):
        model = _model(fields, tok, dtypes[compute_dtype], grad=False)
        tracker = PhaseTracker()
        tracker.track_external(model)
        with tracker:
            tracker.start_phase()
            with contextlib.suppress(DataDependentOutputException):
                continuation_log_likelihoods(model, tok.pad_token_id, requests, batch, desc="trace")
            peak = tracker.peak()
    return {"loglik": peak}
