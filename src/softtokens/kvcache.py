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

    def _buffers(self, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer not in self.keys:
            _, heads, _, dim = like.shape
            shape = (self.slots, heads, self.max_len, dim)
            self.keys[layer] = torch.zeros(shape, dtype=like.dtype, device=self.device)
            self.values[layer] = torch.zeros(shape, dtype=like.dtype, device=self.device)
        return self.keys[layer], self.values[layer]

    # ---------------------------------------------------------------- prefill
    def begin_prefill(self, slots: torch.Tensor, pad: torch.Tensor) -> None:
        """The next forward is a left-padded prompt batch for ``slots``; ``pad`` = each prompt's
        left padding. Its keys and values are stored left-aligned in those slots."""
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
        if self._prefill is not None:
            K, V = self._buffers(layer_idx, key)
            slots, pad = self._prefill
            width = key.shape[2]
            cols = (torch.arange(width, device=key.device).unsqueeze(0) + pad.unsqueeze(1)).clamp(max=width - 1)
            index = cols[:, None, :, None].expand(-1, key.shape[1], -1, key.shape[3])
            K[slots, :, :width] = key.gather(2, index).to(K.dtype)
            V[slots, :, :width] = value.gather(2, index).to(V.dtype)
            return key, value  # the prompt attends to itself only
        return self.write_decode(layer_idx, key, value, self.decode_index(key.shape[1]))

    def decode_index(self, heads: int) -> torch.Tensor:
        """Where a decode step writes: the (slot, head) rows of the flattened cache at each slot's
        length. The same for every layer of a step, so a caller may compute it once per step."""
        return ((self.rows * heads).unsqueeze(1) + torch.arange(heads, device=self.device)).flatten() * self.max_len \
            + self.lengths.repeat_interleave(heads)

    def write_decode(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor, flat: torch.Tensor):
        """One decode position's (N, Hk, 1, D) keys and values at ``flat`` (decode_index), one
        index_copy_ per tensor; returns the layer's cache up to the read window."""
        K, V = self._buffers(layer_idx, key)
        K.view(-1, K.shape[-1]).index_copy_(0, flat, key.reshape(-1, key.shape[-1]).to(K.dtype))
        V.view(-1, V.shape[-1]).index_copy_(0, flat, value.reshape(-1, value.shape[-1]).to(V.dtype))
        return K[:, :, : self.window], V[:, :, : self.window]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        raise RuntimeError("SlotKVCache rows have different lengths: pass position_ids explicitly")

    # ---------------------------------------------------------------- masks
    def decode_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """(slots, 1, 1, window) additive mask: a row sees its own columns 0..length (the new token
        is written at column ``length``)."""
        cols = torch.arange(self.window, device=self.device)
        visible = cols.unsqueeze(0) <= self.lengths.unsqueeze(1)
        return _additive(visible, dtype)[:, None, None, :]


def prefill_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(n, 1, P, P) causal additive mask for a left-padded prompt batch. A padding query sees only
    itself (a fully masked row would give NaN that later layers could pick up)."""
    n, width = attention_mask.shape
    causal = torch.ones(width, width, dtype=torch.bool, device=attention_mask.device).tril()
    visible = causal.unsqueeze(0) & attention_mask.bool().unsqueeze(1)
    visible = visible | torch.eye(width, dtype=torch.bool, device=attention_mask.device).unsqueeze(0)
    return _additive(visible, dtype)[:, None]


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    zero = torch.zeros((), dtype=dtype, device=visible.device)
    return torch.where(visible, zero, torch.finfo(dtype).min)
