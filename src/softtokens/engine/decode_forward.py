"""One decode position of a Llama / Qwen2 / Mistral decoder as plain tensor operations over the
model's own weights, for the engine's per-slot KV cache.

Why: at decode time a small model spends most of a step in the Hugging Face forward's per-call
work, not in arithmetic (measured on the toy, batch 64, CPU: 17 ms of an 18.7 ms step, of which
~4 ms in SDPA's CPU kernel for a single query). Here the rotary tables are computed once per
decoding call by the model's own rotary module (so Llama-3 frequency scaling is the model's), the
attention of the one new query is two batched matmuls with a float32 softmax (as HF's eager
attention), and every layer is ~20 tensor operations with no module dispatch. The arithmetic is
the model's (RMSNorm in float32 then scaled in the compute dtype, SiLU-gated MLP, grouped-query
attention, q/k/v biases when present); tests hold the engine to the reference loop, which uses
the HF forward, in every setting for a Llama and a Qwen2 model. Other architectures decode with
the HF forward (``supports`` says which).

With a shared prefix in the cache (kvcache.py: P columns every slot's prompt starts with), the
scores and outputs over those columns are one GEMM per KV head against the single shared copy,
(slots x groups, dim) @ (dim, P), not a batched product per slot: the attention reads the prefix's
keys and values once per step instead of once per slot. The softmax still runs over the whole
row, prefix columns first, so the arithmetic is the same attention; only the summation of the
output splits in two (prefix + the rest), which rounds differently in the last bits.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from softtokens.engine import flex_decode
from softtokens.engine.fused import EAGER, Elementwise

FAMILIES = ("llama", "qwen2", "mistral")
# how the decode step attends: "matmul", two batched matmuls with a float32 softmax (HF's eager
# attention, bit for bit; the CPU path), "sdpa", torch's fused attention kernel (the GPU path), or "flex",
# FlexAttention's split-K decoding kernel (flex_decode.py; compiled on CUDA, chosen by gpu-check's A/B)
ATTENTIONS = ("matmul", "sdpa", "flex")


def default_attention(device: torch.device) -> str:
    return "sdpa" if torch.device(device).type == "cuda" else "matmul"


def _sdpa_backends(device: torch.device):
    """On CUDA, the memory-efficient kernel (it takes an additive mask and runs inside a CUDA
    graph), else the math one; elsewhere torch's own choice."""
    import contextlib

    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def supports(model) -> bool:
    cfg = model.config
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if cfg.model_type not in FAMILIES or layers is None or not hasattr(decoder, "rotary_emb"):
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "sliding_window", None) and cfg.model_type == "mistral":
        return False
    layer = layers[0]
    return all(hasattr(layer, n) for n in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")) \
        and all(hasattr(layer.mlp, n) for n in ("gate_proj", "up_proj", "down_proj"))


class _LayerWeights(NamedTuple):
    """One decoder layer's tensors, read once per decoding call: ``module.attr`` goes through
    ``nn.Module.__getattr__`` (~1.5 us each, 36 per layer and step)."""

    norm1: torch.Tensor
    eps1: float
    q: torch.Tensor
    q_bias: torch.Tensor | None
    k: torch.Tensor
    k_bias: torch.Tensor | None
    v: torch.Tensor
    v_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    norm2: torch.Tensor
    eps2: float
    gate: torch.Tensor
    gate_bias: torch.Tensor | None
    up: torch.Tensor
    up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None

    @classmethod
    def of(cls, layer) -> "_LayerWeights":
        a, m = layer.self_attn, layer.mlp
        n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
        return cls(n1.weight, n1.variance_epsilon, a.q_proj.weight, a.q_proj.bias, a.k_proj.weight, a.k_proj.bias,
                   a.v_proj.weight, a.v_proj.bias, a.o_proj.weight, a.o_proj.bias, n2.weight, n2.variance_epsilon,
                   m.gate_proj.weight, m.gate_proj.bias, m.up_proj.weight, m.up_proj.bias,
                   m.down_proj.weight, m.down_proj.bias)


class DecodeForward:
    """Callable (x (N, d), positions (N,), cache) -> final hidden states (N, d) of one position.
    The weights are read when it is made (once per decoding call): the model must not be
    re-parameterised while it decodes (an optimizer's in-place update would be seen).
    ``elementwise``: the norms, residual adds, rotary and gated product between the GEMMs, eager or
    compiled into four kernels a layer (fused.py)."""

    def __init__(self, model, max_len: int, attention: str = "matmul", elementwise: Elementwise = EAGER):
        if attention not in ATTENTIONS:
            raise ValueError(f"attention {attention!r}: one of {', '.join(ATTENTIONS)}")
        self.declined = None   # why flex was asked for and not used (flex_decode.declined)
        if attention == "flex" and model.device.type == "cuda":
            self.declined = flex_decode.declined(model.config.num_attention_heads, model.config.num_key_value_heads)
            attention = "sdpa" if self.declined else attention
        self.attention = attention
        self.elementwise = elementwise
        if attention == "flex":
            self.flex = flex_decode.function(compiled=model.device.type == "cuda")
        decoder = model.get_decoder()
        cfg = model.config
        layers = list(decoder.layers)
        self.weights = [_LayerWeights.of(layer) for layer in layers]
        self.norm, self.norm_eps = decoder.norm.weight, decoder.norm.variance_epsilon
        # the residual add and the norm after it are one function (one kernel when fused): a layer's
        # output is added and normed by the next layer's input norm, the last one's by the final norm
        self.next_norms = [(w.norm1, w.eps1) for w in self.weights[1:]] + [(self.norm, self.norm_eps)]
        attn = layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.scale = attn.scaling
        weight = model.get_input_embeddings().weight
        positions = torch.arange(max_len, device=weight.device).unsqueeze(0)
        cos, sin = decoder.rotary_emb(weight[:1].unsqueeze(0), positions)  # the model's own tables
        half = self.head_dim // 2
        self.cos = cos[0]  # (max_len, head_dim), compute dtype
        # rotate_half(x) * sin = cat(-x2, x1) * sin = roll(x, half) * cat(-sin1, sin2): negation is
        # exact and commutes with the product, so this is HF's rotation bit for bit, in fewer calls
        self.sin_signed = torch.cat((-sin[0][:, :half], sin[0][:, half:]), dim=-1)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        n, D, H, Hk = x.shape[0], self.head_dim, self.heads, self.kv_heads
        cos, sin = self.cos[positions].unsqueeze(1), self.sin_signed[positions].unsqueeze(1)  # (N, 1, D)
        # (N, 1, 1, W) additive; flex reads the lengths themselves (cache.length_mask)
        mask = None if self.attention == "flex" else cache.decode_mask(x.dtype).view(n, 1, 1, -1)
        write_at = cache.decode_index(Hk)
        P, G = cache.shared, H // Hk
        ew, layers = self.elementwise, self.weights
        h, r = x, ew.rms_norm(x, layers[0].norm1, layers[0].eps1)
        for i, (w, (next_norm, next_eps)) in enumerate(zip(layers, self.next_norms)):
            q = F.linear(r, w.q, w.q_bias).view(n, H, D)
            k = F.linear(r, w.k, w.k_bias).view(n, Hk, D)
            q, k = ew.rotary(q, k, cos, sin)
            v = F.linear(r, w.v, w.v_bias).view(n, Hk, D)
            K, V = cache.write_decode(i, k.unsqueeze(2), v.unsqueeze(2), write_at)  # (N, Hk, W, D)
            if self.attention == "sdpa":
                o = self._sdpa_attention(q.view(n, Hk, G, D), K, V, mask)
            elif self.attention == "flex":
                o = flex_decode.attend(self.flex, q.view(n, Hk, G, D), K, V, cache.length_mask(), self.scale)
            else:
                o = self._torch_attention(q.view(n, Hk, G, D), K, V, mask, cache.shared_attention[i] if P else None)
            h, r = ew.add_rms_norm(h, F.linear(o, w.o, w.o_bias), w.norm2, w.eps2)
            gated = ew.silu_mul(F.linear(r, w.gate, w.gate_bias), F.linear(r, w.up, w.up_bias))
            h, r = ew.add_rms_norm(h, F.linear(gated, w.down, w.down_bias), next_norm, next_eps)
        return r

    def _sdpa_attention(self, q, K, V, mask) -> torch.Tensor:
        """The same attention as one fused kernel per call (``scaled_dot_product_attention``): the
        G query heads of a KV head are its G query rows, so each slot's keys and values are read
        once, and the scores never leave the kernel (softmax in float32, as HF's attention). The
        GPU path: two batched matmuls with M = G rows ran at ~10 % of the memory bandwidth on an
        H100 (docs/gpu.md). Reads every slot's whole row, shared-prefix columns included (each
        slot holds its copy of them)."""
        n, Hk, G, D = q.shape
        with _sdpa_backends(q.device):
            o = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=self.scale)  # (N, Hk, G, D)
        return o.reshape(n, Hk * G * D)

    def _torch_attention(self, q, K, V, mask, shared) -> torch.Tensor:
        """(N, Hk, G, D) queries over the cache up to the read window (N, Hk, W, D) -> (N, H * D)."""
        n, Hk, G, D = q.shape
        if shared is not None:
            Kp, Vp = shared  # (Hk, D, P), (Hk, P, D)
            P = Vp.shape[1]
            q_heads = q.transpose(0, 1).reshape(Hk, n * G, D)
            scores = torch.cat((torch.bmm(q_heads, Kp).view(Hk, n, G, P).transpose(0, 1),
                                q @ K[:, :, P:].transpose(-1, -2)), dim=-1)
        else:
            scores = q @ K.transpose(-1, -2)
        probs = torch.softmax(scores * self.scale + mask, dim=-1, dtype=torch.float32)
        if q.dtype != torch.float32:
            probs = probs.to(q.dtype)
        if shared is not None:
            o_shared = torch.bmm(probs[..., :P].transpose(0, 1).reshape(Hk, n * G, P), Vp)
            return (probs[..., P:] @ V[:, :, P:] + o_shared.view(Hk, n, G, D).transpose(0, 1)).reshape(n, Hk * G * D)
        return (probs @ V).reshape(n, Hk * G * D)
