"""Causal attention of a long run of new tokens (a prompt's prefill) through the native
library's register-tiled kernel (cpu_prefill_attention.h).

PyTorch's CPU flash kernel is the slower of the two at the narrow heads small models use, and a
prompt after cached rows (a prompt-cache hit with a long new tail) goes to SDPA with a boolean
mask, which computes every score. The kernel takes both: a causal run after `cache_lens` rows.
Anything else (trees, other dtypes, heads that are not a multiple of 8 wide, no compiler, or
SPECDEC_NATIVE=0) stays on PyTorch.
"""

import os

import torch

from specdec_kernels import cpu_decode

MIN_TOKENS = 48  # shorter runs: SDPA's fixed costs are small and the kernel gains nothing


def causal_attention_native(q, k_cache, v_cache, cache_lens, scale=None) -> torch.Tensor | None:
    """q [B, Hq, n, D] over k/v_cache [B, Hkv, S, D], which already hold the n new tokens' rows
    after each sequence's cache_lens[b] committed ones -> [B, Hq, n, D], or None where the kernel
    does not apply (the caller then computes it another way)."""
    batch, heads, n, dim = q.shape
    kv_heads, capacity = k_cache.shape[1], k_cache.shape[2]
    if (n < MIN_TOKENS or q.dtype != torch.float32 or k_cache.dtype != torch.float32
            or v_cache.dtype != torch.float32 or q.device.type != "cpu" or q.stride(-1) != 1
            or dim % 8 or heads % kv_heads or not k_cache.is_contiguous() or not v_cache.is_contiguous()
            or os.environ.get("SPECDEC_NATIVE", "1") == "0"):
        return None
    lib = cpu_decode.library()
    if lib is None:
        return None
    scale = dim ** -0.5 if scale is None else float(scale)
    out = torch.empty(batch, n, heads, dim)  # token-major: the o_proj input is then a free view
    threads = torch.get_num_threads()
    for b in range(batch):
        prefix = int(cache_lens[b])
        if prefix + n > capacity:
            raise ValueError(f"{prefix} cached and {n} new rows do not fit a cache of {capacity}")
        failed = lib.specdec_causal_attention(
            q[b].data_ptr(), q.stride(1), q.stride(2), k_cache[b].data_ptr(), v_cache[b].data_ptr(), capacity,
            out[b].data_ptr(), heads, kv_heads, n, prefix, dim, scale, threads)
        if failed:
            return None
    return out.transpose(1, 2)
