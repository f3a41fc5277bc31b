"""KVCache: one sequence's keys and values for every layer, grown on demand, compacted after acceptance.

Life of a step: the forward writes the new (possibly tree) tokens' keys and values right after
the committed prefix, at [length, length + pending); `keep(indices)` then moves the accepted
nodes into place and drops the rest, or `keep_all()` commits everything (prefill, plain decode).
"""

import functools

import torch


def under_inference_mode(fn):
    """torch.inference_mode() for a function that touches caches (inference tensors, which only
    that mode may update in place), entered only when it is not on already. The scheduler's step
    enters it, and the forwards and cache updates inside it ran torch's own decorator each time,
    a context object built and entered per call, for several calls of every decode step."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)

    return run


class KVCache:
    def __init__(self, num_layers, num_kv_heads, head_dim, *, dtype, device, capacity=256, value_dim=None):
        """value_dim: of the values when it differs from the keys' (0 for MLA, whose values are
        read out of its keys: the compressed latent)."""
        self.shape = (num_layers, 1, num_kv_heads, capacity, head_dim)  # [L, 1, Hkv, S, D]
        self.keys = torch.zeros(self.shape, dtype=dtype, device=device)
        value_shape = self.shape if value_dim is None else self.shape[:4] + (value_dim,)
        self.values = torch.zeros(value_shape, dtype=dtype, device=device)
        self.length = 0  # committed tokens
        self.pending = 0  # tokens written by the last forward, not yet kept or dropped

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def reserve(self, num_new: int) -> None:
        """Make room for num_new tokens after the committed prefix; drops any pending ones."""
        self.pending = num_new
        needed = self.length + num_new
        if needed <= self.capacity:
            return
        new_capacity = max(needed, 2 * self.capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)  # each keeps its own last dimension
            grown = old.new_zeros(old.shape[:3] + (new_capacity, old.shape[4]))
            grown[:, :, :, : self.length] = old[:, :, :, : self.length]
            setattr(self, name, grown)

    def write(self, layer: int, keys, values) -> None:
        """keys/values [Hkv, n, D] of the pending tokens of one layer."""
        end = self.length + keys.shape[1]
        self.keys[layer, 0, :, self.length : end] = keys
        self.values[layer, 0, :, self.length : end] = values

    def keep_all(self) -> None:
        self.length += self.pending
        self.pending = 0

    @under_inference_mode
    def keep(self, indices) -> None:
        """Commit the pending tokens at `indices` (positions within the pending block, ascending)."""
        indices = list(indices)
        if indices != list(range(len(indices))):
            src = torch.tensor(indices, device=self.keys.device) + self.length
            dst = slice(self.length, self.length + len(indices))
            self.keys[:, :, :, dst] = self.keys[:, :, :, src]
            self.values[:, :, :, dst] = self.values[:, :, :, src]
        self.length += len(indices)
        self.pending = 0

    def truncate(self, length: int) -> None:
        """Forget everything after the first `length` committed tokens (prompt-cache reuse)."""
        self.length = min(self.length, length)
        self.pending = 0

    def clone(self, length: int | None = None, capacity: int = 0) -> "KVCache":
        """A copy of the first `length` committed tokens (all by default), with room for `capacity`."""
        length = self.length if length is None else min(length, self.length)
        rows = max(length, capacity, 1)
        copy = KVCache.__new__(KVCache)
        copy.shape = self.shape
        copy.keys = self.keys.new_zeros(self.keys.shape[:3] + (rows, self.keys.shape[4]))
        copy.values = self.values.new_zeros(self.values.shape[:3] + (rows, self.values.shape[4]))
        copy.keys[:, :, :, :length] = self.keys[:, :, :, :length]
        copy.values[:, :, :, :length] = self.values[:, :, :, :length]
        copy.length, copy.pending = length, 0
        return copy

    def nbytes(self) -> int:
        return (self.keys.numel() + self.values.numel()) * self.keys.element_size()
