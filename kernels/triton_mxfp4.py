"""Fused MoE over MXFP4 expert weights with tl.dot_scaled (Blackwell; see mxfp4.py for the format).

The same two grouped GEMMs as triton_moe.py (alignment, block prologue and epilogues shared), except
that each weight tile is loaded packed, two e2m1 values per byte, with its e8m0 scales, and the
tensor cores scale and multiply it in one instruction: the weights cross memory at 4.25 bits.
"""

import torch
import triton
import triton.language as tl

from specdec_kernels.mxfp4 import GROUP
from specdec_kernels.triton_moe import block_pairs, grouped_launch, store_silu_product, store_weighted


@triton.jit
def _packed_tile(w_ptr, s_ptr, expert, rows, k0, n_ok, stride_e, stride_n, s_stride_e, s_stride_n,
                 BLOCK_K: tl.constexpr):
    """W[expert, rows, k0:k0+BLOCK_K] as ([BLOCK_K/2, BLOCK_N] packed bytes, [BLOCK_N, BLOCK_K/32] scales)."""
    half = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    w = tl.load(w_ptr + expert * stride_e + rows[None, :] * stride_n + half[:, None], mask=n_ok[None, :], other=0)
    groups = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    s = tl.load(s_ptr + expert * s_stride_e + rows[:, None] * s_stride_n + groups[None, :], mask=n_ok[:, None],
                other=127)
    return w, s


@triton.jit
def _gate_up_mx_kernel(x_ptr, w_ptr, s_ptr, h_ptr, sorted_pairs_ptr, block_expert_ptr,
                       num_pairs, hidden, inter, stride_x, stride_e, stride_n, s_stride_e, s_stride_n,
                       TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       A_FORMAT: tl.constexpr):
    expert, offs_m, pairs, valid = block_pairs(block_expert_ptr, sorted_pairs_ptr, num_pairs, BLOCK_M)
    tokens = (pairs // TOP_K).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < inter
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):  # hidden is a multiple of BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + tokens[:, None] * stride_x + offs_k[None, :], mask=valid[:, None], other=0.0)
        wg, sg = _packed_tile(w_ptr, s_ptr, expert, offs_n, k0, n_ok, stride_e, stride_n, s_stride_e, s_stride_n,
                              BLOCK_K)
        wu, su = _packed_tile(w_ptr, s_ptr, expert, offs_n + inter, k0, n_ok, stride_e, stride_n, s_stride_e,
                              s_stride_n, BLOCK_K)
        acc_gate = tl.dot_scaled(a, None, A_FORMAT, wg, sg, "e2m1", acc_gate)
        acc_up = tl.dot_scaled(a, None, A_FORMAT, wu, su, "e2m1", acc_up)
    store_silu_product(h_ptr, acc_gate, acc_up, offs_m, offs_n, inter, valid, n_ok)


@triton.jit
def _down_mx_kernel(h_ptr, w_ptr, s_ptr, weights_ptr, out_ptr, sorted_pairs_ptr, block_expert_ptr,
                    num_pairs, hidden, inter, stride_e, stride_n, s_stride_e, s_stride_n,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, A_FORMAT: tl.constexpr):
    expert, offs_m, pairs, valid = block_pairs(block_expert_ptr, sorted_pairs_ptr, num_pairs, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < hidden
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):  # inter is a multiple of BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(h_ptr + offs_m[:, None] * inter + offs_k[None, :], mask=valid[:, None], other=0.0)
        w, s = _packed_tile(w_ptr, s_ptr, expert, offs_n, k0, n_ok, stride_e, stride_n, s_stride_e, s_stride_n,
                            BLOCK_K)
        acc = tl.dot_scaled(a, None, A_FORMAT, w, s, "e2m1", acc)
    store_weighted(out_ptr, weights_ptr, acc, pairs, offs_n, hidden, valid, n_ok)


_A_FORMATS = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def _block_k(k: int, wanted: int) -> int:
    """The largest power-of-two multiple of 32, at most `wanted`, that divides k."""
    block = 32
    while block * 2 <= wanted and k % (block * 2) == 0:
        block *= 2
    return block


def fused_moe_mxfp4_triton(x, w1_packed, w1_scales, w2_packed, w2_scales, topk_weights, topk_ids):
    """x [T, H] bf16/fp16; w1 [E, 2I, H/2] + [E, 2I, H/32]; w2 [E, H, I/2] + [E, H, I/32] -> [T, H]."""
    assert x.dtype in _A_FORMATS, "MXFP4 experts take bf16 or fp16 activations"
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = w1_packed.shape
    inter = two_inter // 2
    assert hidden % GROUP == 0 and inter % GROUP == 0, f"H and I must be multiples of {GROUP}"
    assert w1_packed.shape[2] * 2 == hidden and w2_packed.shape == (num_experts, hidden, inter // 2), "shape mismatch"
    grouped = grouped_launch(x, topk_ids, num_experts, inter, torch.uint8)
    if grouped is None:
        return x.new_zeros(0, hidden)
    top_k, num_pairs, out_pairs, cfg, sorted_pairs, block_expert, h = grouped
    fmt, launch = _A_FORMATS[x.dtype], dict(num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 2))
    block_n = cfg["BLOCK_N"]
    grid = (block_expert.numel(), triton.cdiv(inter, block_n))
    _gate_up_mx_kernel[grid](x, w1_packed, w1_scales, h, sorted_pairs, block_expert, num_pairs, hidden, inter,
                             x.stride(0), w1_packed.stride(0), w1_packed.stride(1), w1_scales.stride(0),
                             w1_scales.stride(1), TOP_K=top_k, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=block_n,
                             BLOCK_K=_block_k(hidden, cfg["BLOCK_K"]), A_FORMAT=fmt, **launch)
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    grid = (block_expert.numel(), triton.cdiv(hidden, block_n))
    _down_mx_kernel[grid](h, w2_packed, w2_scales, weights, out_pairs, sorted_pairs, block_expert, num_pairs, hidden,
                          inter, w2_packed.stride(0), w2_packed.stride(1), w2_scales.stride(0), w2_scales.stride(1),
                          BLOCK_M=cfg["BLOCK_M"], BLOCK_N=block_n, BLOCK_K=_block_k(inter, cfg["BLOCK_K"]),
                          A_FORMAT=fmt, **launch)
    return out_pairs.view(num_tokens, top_k, hidden).sum(dim=1)
