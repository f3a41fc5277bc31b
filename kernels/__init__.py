"""Kernels for the target model's hot operations, with one entry point per operation.

Each function sends CUDA tensors to a Triton kernel and CPU tensors to its PyTorch reference;
SPECDEC_KERNELS=triton|torch|auto overrides the choice, read once at load (see dispatch.py).
On the CPU a long causal run's attention (a prompt's prefill) goes to the native library's
kernel where it is built (attention_cpu.py).
"""

if __name__ != "specdec_kernels":  # found by its folder's name: the repository root is first on sys.path
    raise ImportError(f"{__file__} is specdec_kernels, found here as {__name__!r} because the repository root comes "
                      "before site-packages on sys.path (Hugging Face's `kernels`, which transformers imports, is "
                      "another package); run Python from another folder, or with -P")

import torch  # noqa: E402

from specdec_kernels.attention_cpu import causal_attention_native
from specdec_kernels.attention_torch import tree_attention_torch
from specdec_kernels.dispatch import backend_for, configure_from_environment, set_backend
from specdec_kernels.moe_torch import ExpertActivation, fused_moe_torch, moe_route_torch
from specdec_kernels.mxfp4 import dequantize_mxfp4, quantize_mxfp4, uses_dot_scaled

__all__ = ["moe_route", "fused_moe", "tree_attention", "ExpertActivation", "dequantize", "dequantize_mxfp4", "quantize_mxfp4",
           "backend_for", "configure_from_environment", "set_backend"]


def moe_route(router_logits, top_k: int, renormalize: bool, mode: str = "softmax_topk", groups: tuple = ()):
    """router_logits [T, E] -> (topk_weights [T, k] fp32, topk_ids [T, k] int64); mode
    "topk_softmax" (GPT-OSS) and group-limited routing (DeepSeek) run PyTorch on every device."""
    if mode != "softmax_topk" or groups:
        return moe_route_torch(router_logits, top_k, renormalize, mode, groups)
    if backend_for(router_logits) == "triton":
        from specdec_kernels.triton_moe import moe_route_triton

        return moe_route_triton(router_logits, top_k, renormalize)
    return moe_route_torch(router_logits, top_k, renormalize)


def fused_moe(x, w_gate_up, w_down, topk_weights, topk_ids, *, w1_scale=None, w2_scale=None, block_shape=None,
              act: ExpertActivation | None = None):
    """x [T, H], w_gate_up [E, 2I, H], w_down [E, H, I], topk_* [T, k] -> [T, H].

    fp8 e4m3 weights take scales: per channel (w1_scale [E, 2I], w2_scale [E, H]) or, with
    block_shape (128, 128), per block (w1_scale [E, 2I/128, H/128], w2_scale [E, H/128, I/128]).
    MXFP4 weights are uint8, packed two per byte ([E, 2I, H/2], [E, H, I/2]), with e8m0 scales
    per 32 ([E, 2I, H/32], [E, H, I/32]); see mxfp4.py. They run natively on Blackwell and are
    dequantised to x's dtype elsewhere. `act` (expert biases, GPT-OSS's clamped SwiGLU) runs
    the PyTorch path on every device: the Triton kernels compute the plain SwiGLU only.
    """
    if w_gate_up.dtype == torch.uint8:
        return _fused_moe_mxfp4(x, w_gate_up, w_down, topk_weights, topk_ids, w1_scale, w2_scale, act)
    if act is not None:
        return fused_moe_torch(x, w_gate_up, w_down, topk_weights, topk_ids, act)
    if backend_for(x) == "triton":
        from specdec_kernels.triton_moe import fused_moe_triton

        # The CPU model stores gate_up input-major (see Transformer._input_major_weights); the
        # kernels read the checkpoint layout (a no-op on CUDA, a copy under the interpreter).
        w_gate_up, w_down = w_gate_up.contiguous(), w_down.contiguous()
        return fused_moe_triton(x, w_gate_up, w_down, topk_weights, topk_ids,
                                w1_scale=w1_scale, w2_scale=w2_scale, block_shape=block_shape)
    if w1_scale is not None:
        w_gate_up = dequantize(w_gate_up, w1_scale, block_shape, x.dtype)
        w_down = dequantize(w_down, w2_scale, block_shape, x.dtype)
    return fused_moe_torch(x, w_gate_up, w_down, topk_weights, topk_ids)


def _fused_moe_mxfp4(x, w1_packed, w2_packed, topk_weights, topk_ids, w1_scales, w2_scales, act=None):
    if w1_scales is None or w2_scales is None:
        raise ValueError("MXFP4 (uint8) expert weights need their e8m0 scales (w1_scale, w2_scale)")
    if backend_for(x) == "triton" and uses_dot_scaled(x) and act is None:
        from specdec_kernels.triton_mxfp4 import fused_moe_mxfp4_triton

        return fused_moe_mxfp4_triton(x, w1_packed, w1_scales, w2_packed, w2_scales, topk_weights, topk_ids)
    w_gate_up, w_down = dequantize_mxfp4(w1_packed, w1_scales, x.dtype), dequantize_mxfp4(w2_packed, w2_scales, x.dtype)
    return fused_moe(x, w_gate_up, w_down, topk_weights, topk_ids, act=act)


def dequantize(weight, scale, block_shape, dtype):
    """fp8 [E, N, K] with per-channel [E, N] or per-block [E, N/b, K/b] scales -> dtype."""
    w = weight.float()
    if block_shape is None:
        return (w * scale[..., None]).to(dtype)
    b = block_shape[0]
    e, n, k = w.shape
    return (w.view(e, n // b, b, k // b, b) * scale[:, :, None, :, None]).view(e, n, k).to(dtype)


def tree_attention(q, k_cache, v_cache, cache_lens, tree_mask=None, scale=None, *, sinks=None, window: int = 0,
                   positions=None):
    """q [B, Hq, Tq, D] over k/v_cache [B, Hkv, S, D] -> [B, Hq, Tq, D]; see attention_torch.
    Attention sinks and sliding windows (GPT-OSS) run the PyTorch path on every device."""
    if sinks is not None or window or v_cache.shape[-1] != q.shape[-1]:  # MLA: values narrower than keys
        return tree_attention_torch(q, k_cache, v_cache, cache_lens, tree_mask, scale, sinks=sinks, window=window,
                                    positions=positions)
    if backend_for(q) == "triton":
        from specdec_kernels.triton_attention import tree_attention_triton

        return tree_attention_triton(q, k_cache, v_cache, cache_lens, tree_mask, scale)
    if tree_mask is None:  # a causal run: a prompt's prefill
        out = causal_attention_native(q, k_cache, v_cache, cache_lens, scale)
        if out is not None:
            return out
    return tree_attention_torch(q, k_cache, v_cache, cache_lens, tree_mask, scale)
