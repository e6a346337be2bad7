"""Mixed precision and sharded data parallel for the update pass, on torch's FSDP2 (``fully_shard``).

The policy a run trains is held three ways:
- master weights in ``param_dtype`` (float32), sharded over the job's processes as DTensors,
  with their float32 gradients and AdamW state (16 bytes per parameter, divided by the
  number of processes);
- during the update pass, each decoder layer's weights gathered in ``compute_dtype`` (bf16 on
  GPU) for its forward and backward only; gradients are reduce-scattered in float32 and
  accumulated into the float32 shards, micro-batch after micro-batch;
- a plain (unsharded) copy of the whole model in ``compute_dtype`` for rollouts and greedy
  validation, refreshed from the master weights after every optimizer step: one all-gather
  per tensor per step, never one per decode step. So the rollout of step t sees the update of
  step t-1, and the decode loop runs on an ordinary module.

Nothing here depends on the number of processes: a lone process shards over a group of one.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from softtokens.model.cpu_bf16 import recompute_as_forward
from softtokens.model.loading import DTYPES
from softtokens.train.rloo import Replay, rollout_log_probs


class ReplayPolicy(torch.nn.Module):
    """The update pass as one module call, so that FSDP gathers the root's weights (E, the
    output head, the final norm) for exactly the call that reads them: the replay forward, the
    float32 logits, and h0 = softmax(logits / tau) @ E (softtokens.rloo.rollout_log_probs)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, rollout, sigma: float, answer_temperature: float, vocab_rows: int,
                gaussian_scale: float, logit_tolerance: float = 0.0, row_weights: torch.Tensor | None = None) -> Replay:
        return rollout_log_probs(self.lm, rollout, sigma, answer_temperature, vocab_rows, gaussian_scale,
                                 logit_tolerance, row_weights)


def decoder_layers(lm) -> list[torch.nn.Module]:
    """The repeated blocks of a causal LM (Llama, Qwen2: ``model.layers``): one FSDP unit each."""
    layers = getattr(lm.get_decoder(), "layers", None)
    if layers is None:
        raise ValueError(f"{type(lm).__name__}: no decoder.layers to shard")
    return list(layers)


def shard_policy(lm, mesh, compute_dtype: str, param_dtype: str = "float32",
                 activation_checkpointing: bool = False) -> ReplayPolicy:
    """Wrap ``lm`` (master weights in ``param_dtype``) for the update pass: one FSDP unit per
    decoder layer and the root (embeddings, final norm, output head; tied weights stay together).

    Forward inputs are not cast (``cast_forward_inputs=False``): the recorded soft inputs h~ are
    float32 and the Gaussian term reads them in float32; the replay casts what it feeds."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if DTYPES[param_dtype].itemsize < 4:
        raise ValueError(f"param_dtype {param_dtype}: master weights below float32 drop AdamW updates "
                         "(docs/engine.md, 'Precision and sharding')")
    compute = DTYPES[compute_dtype]
    mp = MixedPrecisionPolicy(param_dtype=None if compute == DTYPES[param_dtype] else compute,
                              reduce_dtype=torch.float32 if param_dtype == "float32" else DTYPES[param_dtype],
                              cast_forward_inputs=False)
    if activation_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False,
                                                                        "context_fn": recompute_as_forward})
    policy = ReplayPolicy(lm)
    units = [*decoder_layers(lm), policy]
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=mp)
    for unit in units:  # sum, not average: each process's loss is already divided by the global row count
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
    return policy


def rollout_copy(lm, compute_dtype: str, device: torch.device):
    """An unsharded copy of ``lm`` for decoding: parameters cast to ``compute_dtype`` (FSDP's
    mixed precision casts the same way), buffers untouched (RoPE's inv_freq stays float32, as
    in the update pass). Each parameter is cast on its way to ``device``, one at a time (deepcopy's memo
    hands the copies in, tied ones once): no second float32 copy of the model is held on the host (a process
    of llama-8b held two, 64 GB, while it started)."""
    memo = {id(p): torch.nn.Parameter(p.detach().to(device=device, dtype=DTYPES[compute_dtype], copy=True),
                                      requires_grad=False)
            for p in lm.parameters()}
    plain = copy.deepcopy(lm, memo)
    return plain.to(device).eval()


@torch.no_grad()
def refresh_rollout_weights(policy: ReplayPolicy, plain) -> None:
    """Copy the current master weights into the rollout copy, in its dtype: each tensor is cast
    on its shard, then all-gathered (bf16 traffic, half of float32's)."""
    from torch.distributed.tensor import DTensor

    dst = dict(plain.named_parameters())
    for name, p in policy.lm.named_parameters():
        target = dst[name]
        src = p.to(target.dtype)
        target.copy_(src.full_tensor() if isinstance(src, DTensor) else src)


def full_state_dict(policy: ReplayPolicy) -> dict[str, torch.Tensor]:
    """The consolidated master weights on CPU, keyed like the plain model's state dict (every
    process takes part; every process receives it)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    sd = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # a tied weight once, under its first name (E), as save_pretrained writes it: gathered copies
    # no longer share storage, so save_pretrained could not see the tie itself
    keep = {n for n, _ in policy.lm.named_parameters()} | {n for n, _ in policy.lm.named_buffers()}
    return {k.removeprefix("lm."): v for k, v in sd.items() if k.removeprefix("lm.") in keep}


def staged_weights(policy: ReplayPolicy) -> dict[str, torch.Tensor]:
    """The consolidated master weights as a snapshot in host memory that training may run on from
    (collective; see full_state_dict): a gathered tensor that still shares storage with a live parameter (a
    group of one on CPU hands back the parameter itself) is copied, so a background write cannot see a
    later step's values."""
    from torch.distributed.tensor import DTensor

    live = {(t.to_local() if isinstance(t, DTensor) else t).untyped_storage().data_ptr()
            for t in [*policy.parameters(), *policy.buffers()]}
    return {k: v.clone() if v.untyped_storage().data_ptr() in live else v for k, v in full_state_dict(policy).items()}


def checkpoint_shell(policy: ReplayPolicy, dtype: torch.dtype = torch.float32):
    """The policy's model class and config with no storage (meta device) in the master weights' dtype: what
    ``save_pretrained`` reads besides the weights (config, generation config, dtype, tied names), so that a
    background write never looks at the live model (FSDP swaps its parameters for bf16 gathered ones in every
    forward). Built in the main thread."""
    lm = policy.lm
    with torch.device("meta"):
        shell = type(lm)(copy.deepcopy(lm.config)).to(dtype)
    shell.generation_config = copy.deepcopy(lm.generation_config)
    return shell


def write_pretrained(shell, weights: dict[str, torch.Tensor], out: Path) -> None:
    """A ``save_pretrained`` directory of staged weights that plain ``AutoModelForCausalLM.from_pretrained``
    loads, written through ``checkpoint_shell`` (safe beside training)."""
    shell.save_pretrained(out, state_dict=dict(weights))   # a copy: save_pretrained takes entries out of the dict
    if not any(out.glob("*.safetensors")):
        raise RuntimeError(f"save_pretrained wrote no weights to {out}")


def save_optimizer_async(policy: ReplayPolicy, opt, out: Path, group):
    """AdamW state as a torch.distributed.checkpoint directory, each process writing its shards in the
    background (``dcp.async_save``: the state is copied to host memory before it returns, so the next
    ``opt.step()`` cannot reach the files); collective over ``group``; it loads back on any number of
    processes. Returns the future of the write (the checkpoint is complete when it is done on every process)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return dcp.async_save({"optimizer": get_optimizer_state_dict(policy, opt)}, checkpoint_id=str(out),
                          process_group=group)


def load_optimizer(policy: ReplayPolicy, opt, path: Path) -> None:
    if not Path(path).is_dir():   # train.loop: the last step's save holds the weights alone
        raise FileNotFoundError(f"{path}: no optimizer state to resume from: {Path(path).parent} is the last step's "
                                f"save of a run that ended there; a run of more steps cannot go on from it (remove "
                                f"{Path(path).parent.parent} to train from step 0, or run the steps it was made with)")
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    from softtokens.model.data_only import safe_planner, safe_reader

    state = {"optimizer": get_optimizer_state_dict(policy, opt)}  # the template: shapes and shards
    # read as data only: DCP's pickled metadata by an unpickler of its own types, entries with weights_only
    dcp.load(state, storage_reader=safe_reader(path), planner=safe_planner())
    set_optimizer_state_dict(policy, opt, optim_state_dict=state["optimizer"])


def local_bytes(tensors) -> int:
    """Bytes this process holds for ``tensors`` (a DTensor counts its local shard)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def optimizer_state_tensors(opt) -> list[torch.Tensor]:
    """The tensors of AdamW's state that scale with the model (exp_avg, exp_avg_sq)."""
    return [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
