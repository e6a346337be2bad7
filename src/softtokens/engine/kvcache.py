"""A preallocated key/value cache with one slot per decoding row and a write position per slot.

Why not Hugging Face's StaticCache: it writes every row at one shared position, so a batch must
be left-padded to a common length and a finished row cannot hand its slot to a new prompt. Here
each slot holds its row left-aligned (column j = position j, no padding), rows advance
independently, and a new prompt can be prefilled into any free slot while the others keep their
state (evaluation refills slots as rows finish). The decode write is one ``index_put`` per layer
at (slot, position) pairs held in a device tensor, so a decode step has fixed shapes and no
host round-trip (it can be captured in a CUDA graph).

The model's attention layers call ``update(key, value, layer_idx)``, the only cache method they
use when position ids and a 4D mask are passed (transformers >= 5, Llama / Qwen2 families).

A shared prefix (the instruction every prompt of a call starts with) is prefilled once, into
``shared_keys`` / ``shared_values`` (1, heads, P, dim); each slot's first P columns hold copies
(column j = position j still holds for every slot, so any reader of a slot sees its whole row),
and the plain-tensor decode reads the one shared copy for those columns instead of 64.
"""

from __future__ import annotations

import torch


class SlotKVCache:
    def __init__(self, slots: int, max_len: int, device: torch.device):
        self.slots, self.max_len, self.device = slots, max_len, device
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)  # tokens held per slot
        self.rows = torch.arange(slots, device=device)
        self.window = max_len  # columns the decode attention reads (all of them in fixed-shape mode)
        self._prefill: tuple[torch.Tensor, torch.Tensor] | None = None
        self.shared = 0  # columns 0..shared-1: the prefix every slot's prompt starts with
        self.shared_keys: dict[int, torch.Tensor] = {}
        self.shared_values: dict[int, torch.Tensor] = {}
        # per layer, the shared prefix as the decode attention reads it: keys (heads, dim, P) and
        # values (heads, P, dim), views made once per call, not at every step
        self.shared_attention: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._sharing = False
        self._length_mask = None  # FlexAttention's score_mod over ``lengths`` (length_mask), made once

    def buffers(self, layer: int, heads: int, dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's (slots, heads, max_len, dim) keys and values, made (zeroed) on first use."""
        if layer not in self.keys:
            shape = (self.slots, heads, self.max_len, dim)
            self.keys[layer] = torch.zeros(shape, dtype=dtype, device=self.device)
            self.values[layer] = torch.zeros(shape, dtype=dtype, device=self.device)
        return self.keys[layer], self.values[layer]

    # ---------------------------------------------------------------- prefill
    def begin_shared(self) -> None:
        """The next forward is the shared prefix alone, one row of P tokens at positions 0..P-1
        (causal mask); its keys and values become ``shared_keys`` / ``shared_values``."""
        if self.shared or self._prefill is not None:
            raise RuntimeError("the shared prefix is prefilled once, before any prompt")
        self._sharing = True

    def end_shared(self) -> None:
        self._sharing = False
        self.shared = next(iter(self.shared_keys.values())).shape[2] if self.shared_keys else 0
        self.shared_attention = [(self.shared_keys[i][0].transpose(-1, -2), self.shared_values[i][0])
                                 for i in sorted(self.shared_keys)]

    def begin_prefill(self, slots: torch.Tensor, pad: torch.Tensor) -> None:
        """The next forward is a left-padded prompt batch for ``slots``; ``pad`` = each prompt's
        left padding. Its keys and values are stored left-aligned in those slots. With a shared
        prefix the batch holds only what follows it (positions from P on, a mask over P + width
        key columns: prefill_mask(..., shared=P)) and its attention sees the prefix first."""
        self._prefill = (slots, pad)

    def end_prefill(self, real_lengths: torch.Tensor) -> None:
        slots, _ = self._prefill
        self.lengths[slots] = real_lengths
        self._prefill = None

    def copy_slots(self, dst: torch.Tensor, src: torch.Tensor, width: int) -> None:
        """Slots ``dst`` take the first ``width`` cache columns and the lengths of slots ``src``
        (a repeated prompt prefilled once)."""
        for layer in self.keys:
            self.keys[layer][dst, :, :width] = self.keys[layer][src, :, :width]
            self.values[layer][dst, :, :width] = self.values[layer][src, :, :width]
        self.lengths[dst] = self.lengths[src]

    # ---------------------------------------------------------------- the attention layers' call
    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        if self._sharing:
            self.shared_keys[layer_idx] = key.detach().clone(memory_format=torch.contiguous_format)
            self.shared_values[layer_idx] = value.detach().clone(memory_format=torch.contiguous_format)
            return key, value
        if self._prefill is not None:
            K, V = self.buffers(layer_idx, key.shape[1], key.shape[3], key.dtype)
            slots, pad = self._prefill
            width, P = key.shape[2], self.shared
            cols = (torch.arange(width, device=key.device).unsqueeze(0) + pad.unsqueeze(1)).clamp(max=width - 1)
            index = cols[:, None, :, None].expand(-1, key.shape[1], -1, key.shape[3])
            K[slots, :, P:P + width] = key.gather(2, index).to(K.dtype)
            V[slots, :, P:P + width] = value.gather(2, index).to(V.dtype)
            if not P:
                return key, value  # the prompt attends to itself only
            Kp, Vp = self.shared_keys[layer_idx], self.shared_values[layer_idx]
            K[slots, :, :P] = Kp.to(K.dtype)
            V[slots, :, :P] = Vp.to(V.dtype)
            n = key.shape[0]
            return (torch.cat((Kp.expand(n, -1, -1, -1), key), dim=2),
                    torch.cat((Vp.expand(n, -1, -1, -1), value), dim=2))  # the prefix, then the prompt
        return self.write_decode(layer_idx, key, value, self.decode_index(key.shape[1]))

    def decode_index(self, heads: int) -> torch.Tensor:
        """Where a decode step writes: the (slot, head) rows of the flattened cache at each slot's
        length. The same for every layer of a step, so a caller may compute it once per step."""
        return ((self.rows * heads).unsqueeze(1) + torch.arange(heads, device=self.device)).flatten() * self.max_len \
            + self.lengths.repeat_interleave(heads)

    def write_decode(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor, flat: torch.Tensor):
        """One decode position's (N, Hk, 1, D) keys and values at ``flat`` (decode_index), one
        index_copy_ per tensor; returns the layer's cache up to the read window."""
        K, V = self.buffers(layer_idx, key.shape[1], key.shape[3], key.dtype)
        K.view(-1, K.shape[-1]).index_copy_(0, flat, key.reshape(-1, key.shape[-1]).to(K.dtype))
        V.view(-1, V.shape[-1]).index_copy_(0, flat, value.reshape(-1, value.shape[-1]).to(V.dtype))
        return K[:, :, : self.window], V[:, :, : self.window]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        raise RuntimeError("SlotKVCache rows have different lengths: pass position_ids explicitly")

    # ---------------------------------------------------------------- masks
    def length_mask(self):
        """The decode mask as FlexAttention's score_mod over ``lengths`` (engine.flex_decode), made once."""
        if self._length_mask is None:
            from softtokens.engine.flex_decode import length_mask

            self._length_mask = length_mask(self.lengths)
        return self._length_mask

    def decode_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """(slots, 1, 1, window) additive mask: a row sees its own columns 0..length (the new token
        is written at column ``length``)."""
        cols = torch.arange(self.window, device=self.device)
        visible = cols.unsqueeze(0) <= self.lengths.unsqueeze(1)
        return _additive(visible, dtype)[:, None, None, :]


def prefill_mask(attention_mask: torch.Tensor, dtype: torch.dtype, shared: int = 0) -> torch.Tensor:
    """(n, 1, W, shared + W) causal additive mask for a left-padded prompt batch of width W whose
    rows all follow a ``shared`` prefix (seen by every query). A padding query sees only itself
    and the prefix (a fully masked row would give NaN that later layers could pick up)."""
    n, width = attention_mask.shape
    dev = attention_mask.device
    causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
    visible = causal.unsqueeze(0) & attention_mask.bool().unsqueeze(1)
    visible = visible | torch.eye(width, dtype=torch.bool, device=dev).unsqueeze(0)
    if shared:
        visible = torch.cat((torch.ones(n, width, shared, dtype=torch.bool, device=dev), visible), dim=2)
    return _additive(visible, dtype)[:, None]


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    zero = torch.zeros((), dtype=dtype, device=visible.device)
    return torch.where(visible, zero, torch.finfo(dtype).min)
