"""Fused MoE in Triton: routing, block alignment by expert, and two grouped GEMMs with fused epilogues.

  moe_route_triton   softmax -> top-k -> optional renormalisation, one program per token
  align_by_expert    (token, slot) pairs sorted by expert, each expert's run padded to BLOCK_M,
                     one expert id per block; experts without tokens get no blocks
  _gate_up_kernel    h = silu(x @ W_gate^T) * (x @ W_up^T) for each block of pairs   [pairs, I]
  _down_kernel       y_pair = w_pair * (h @ W_down^T), written to its own row        [T*k, H]
Weights may be fp32, fp16, bf16, or fp8 e4m3 with per-channel ([E, N]) or 128x128 block
([E, N/128, K/128]) scales, dequantised in the GEMM's inner loop.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specdec_kernels.configs import launch_config

# T = tokens, E = experts, H = hidden, I = expert intermediate, A = top_k, P = T * A pairs


@triton.jit
def _route_kernel(logits_ptr,  # [T, E]
                  weights_ptr,  # [T, A] fp32
                  ids_ptr,  # [T, A] int64
                  num_experts, stride_t,
                  TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, RENORMALIZE: tl.constexpr):
    t = tl.program_id(0)
    e = tl.arange(0, BLOCK_E)
    valid = e < num_experts
    x = tl.load(logits_ptr + t * stride_t + e, mask=valid, other=-float("inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = tl.where(valid, p, 0.0)
    p = p / tl.sum(p, axis=0)
    total = 1.0
    if RENORMALIZE:
        total = 0.0
        scan = p
        for _ in tl.static_range(TOP_K):
            best = tl.max(scan, axis=0)
            total += best
            scan = tl.where(e == tl.argmax(scan, axis=0), -1.0, scan)
    for i in tl.static_range(TOP_K):
        best = tl.max(p, axis=0)
        index = tl.argmax(p, axis=0)
        tl.store(weights_ptr + t * TOP_K + i, best / total)
        tl.store(ids_ptr + t * TOP_K + i, index.to(tl.int64))
        p = tl.where(e == index, -1.0, p)


def moe_route_triton(router_logits, top_k: int, renormalize: bool):
    assert router_logits.ndim == 2 and router_logits.is_contiguous(), "router_logits must be contiguous [T, E]"
    num_tokens, num_experts = router_logits.shape
    assert 0 < top_k <= num_experts
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=router_logits.device)
    if num_tokens:
        _route_kernel[(num_tokens,)](router_logits, weights, ids, num_experts, router_logits.stride(0),
                                     TOP_K=top_k, BLOCK_E=triton.next_power_of_2(num_experts), RENORMALIZE=renormalize)
    return weights, ids


def align_by_expert(topk_ids, num_experts: int, block_m: int):
    """-> (sorted_pairs [padded] int32 with P as padding, block_expert [blocks] int32).

    The scheme of vLLM's moe_align_block_size, in device-side torch ops.
    """
    flat = topk_ids.reshape(-1)
    num_pairs = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    order = torch.argsort(flat, stable=True)
    expert_of_sorted = flat[order]
    rank = torch.arange(num_pairs, device=flat.device) - (torch.cumsum(counts, 0) - counts)[expert_of_sorted]
    destination = (torch.cumsum(padded, 0) - padded)[expert_of_sorted] + rank
    total = int(padded.sum())
    sorted_pairs = torch.full((total,), num_pairs, dtype=torch.int32, device=flat.device)
    sorted_pairs[destination] = order.to(torch.int32)
    block_expert = torch.repeat_interleave(torch.arange(num_experts, device=flat.device, dtype=torch.int32),
                                           padded // block_m)
    return sorted_pairs, block_expert


@triton.jit
def _load_weight_tile(w_ptr, expert, rows, cols, stride_e, stride_n, stride_k, mask,
                      scale_ptr, scale_stride_e, scale_stride_n, scale_stride_k,
                      SCALE_MODE: tl.constexpr, SCALE_BLOCK: tl.constexpr):
    """W[expert, rows, cols] as an fp32 [BLOCK_K, BLOCK_N] tile (cols along K, rows along N), dequantised."""
    w = tl.load(w_ptr + expert * stride_e + rows[None, :] * stride_n + cols[:, None] * stride_k, mask=mask, other=0.0)
    w = w.to(tl.float32)
    if SCALE_MODE == 1:  # per output channel
        row_ok = tl.max(mask.to(tl.int32), axis=0) > 0
        s = tl.load(scale_ptr + expert * scale_stride_e + rows * scale_stride_n, mask=row_ok, other=1.0)
        w = w * s[None, :]
    elif SCALE_MODE == 2:  # SCALE_BLOCK x SCALE_BLOCK blocks
        s = tl.load(scale_ptr + expert * scale_stride_e + (rows[None, :] // SCALE_BLOCK) * scale_stride_n
                    + (cols[:, None] // SCALE_BLOCK) * scale_stride_k, mask=mask, other=1.0)
        w = w * s
    return w


@triton.jit
def block_pairs(block_expert_ptr, sorted_pairs_ptr, num_pairs, BLOCK_M: tl.constexpr):
    """The expert of this program's block of sorted pairs, the rows, the pair ids, which are real."""
    pid_m = tl.program_id(0)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_pairs_ptr + offs_m)
    return expert, offs_m, pairs, pairs < num_pairs


@triton.jit
def store_silu_product(h_ptr, acc_gate, acc_up, offs_m, offs_n, inter, valid, n_ok):
    """GEMM 1's epilogue: h = silu(gate) * up, one row per sorted pair."""
    h = acc_gate * tl.sigmoid(acc_gate) * acc_up
    tl.store(h_ptr + offs_m[:, None] * inter + offs_n[None, :], h.to(h_ptr.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])


@triton.jit
def store_weighted(out_ptr, weights_ptr, acc, pairs, offs_n, hidden, valid, n_ok):
    """GEMM 2's epilogue: the routing weight multiplied in, each pair written to its own row."""
    routing = tl.load(weights_ptr + pairs, mask=valid, other=0.0)
    acc = acc * routing[:, None]
    tl.store(out_ptr + pairs.to(tl.int64)[:, None] * hidden + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])


@triton.jit
def _gate_up_kernel(x_ptr,  # [T, H]
                    w_ptr,  # [E, 2I, H]
                    scale_ptr, h_ptr,  # [padded, I]
                    sorted_pairs_ptr, block_expert_ptr,
                    num_pairs, hidden, inter, stride_x, stride_e, stride_n, stride_k,
                    scale_stride_e, scale_stride_n, scale_stride_k,
                    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    SCALE_MODE: tl.constexpr, SCALE_BLOCK: tl.constexpr, DOT_FP32: tl.constexpr):
    expert, offs_m, pairs, valid = block_pairs(block_expert_ptr, sorted_pairs_ptr, num_pairs, BLOCK_M)
    tokens = (pairs // TOP_K).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < inter
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < hidden
        a = tl.load(x_ptr + tokens[:, None] * stride_x + offs_k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
        wmask = k_ok[:, None] & n_ok[None, :]
        wg = _load_weight_tile(w_ptr, expert, offs_n, offs_k, stride_e, stride_n, stride_k, wmask, scale_ptr,
                               scale_stride_e, scale_stride_n, scale_stride_k, SCALE_MODE, SCALE_BLOCK)
        wu = _load_weight_tile(w_ptr, expert, offs_n + inter, offs_k, stride_e, stride_n, stride_k, wmask, scale_ptr,
                               scale_stride_e, scale_stride_n, scale_stride_k, SCALE_MODE, SCALE_BLOCK)
        if DOT_FP32:
            a32 = a.to(tl.float32)
            acc_gate += tl.dot(a32, wg, input_precision="ieee")
            acc_up += tl.dot(a32, wu, input_precision="ieee")
        else:
            acc_gate += tl.dot(a, wg.to(a.dtype))
            acc_up += tl.dot(a, wu.to(a.dtype))
    store_silu_product(h_ptr, acc_gate, acc_up, offs_m, offs_n, inter, valid, n_ok)


@triton.jit
def _down_kernel(h_ptr,  # [padded, I]
                 w_ptr,  # [E, H, I]
                 scale_ptr, weights_ptr,  # [P] fp32 routing weights
                 out_ptr,  # [P, H]
                 sorted_pairs_ptr, block_expert_ptr,
                 num_pairs, hidden, inter, stride_e, stride_n, stride_k,
                 scale_stride_e, scale_stride_n, scale_stride_k,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SCALE_MODE: tl.constexpr, SCALE_BLOCK: tl.constexpr, DOT_FP32: tl.constexpr):
    expert, offs_m, pairs, valid = block_pairs(block_expert_ptr, sorted_pairs_ptr, num_pairs, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < hidden
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < inter
        a = tl.load(h_ptr + offs_m[:, None] * inter + offs_k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
        w = _load_weight_tile(w_ptr, expert, offs_n, offs_k, stride_e, stride_n, stride_k,
                              k_ok[:, None] & n_ok[None, :], scale_ptr, scale_stride_e, scale_stride_n,
                              scale_stride_k, SCALE_MODE, SCALE_BLOCK)
        if DOT_FP32:
            acc += tl.dot(a.to(tl.float32), w, input_precision="ieee")
        else:
            acc += tl.dot(a, w.to(a.dtype))
    store_weighted(out_ptr, weights_ptr, acc, pairs, offs_n, hidden, valid, n_ok)


def _scale_args(scale, weight, block_shape):
    """(tensor, strides, SCALE_MODE, SCALE_BLOCK) for a weight's optional fp8 scales."""
    if scale is None:
        return weight, (0, 0, 0), 0, 1
    if block_shape is None:
        assert scale.shape == weight.shape[:2], f"per-channel scale must be {tuple(weight.shape[:2])}"
        return scale, (scale.stride(0), scale.stride(1), 0), 1, 1
    assert block_shape[0] == block_shape[1], "square scale blocks only"
    return scale, (scale.stride(0), scale.stride(1), scale.stride(2)), 2, block_shape[0]


class GroupedLaunch(NamedTuple):
    """What both grouped-GEMM launches of one MoE call share (fp and MXFP4 weights alike)."""

    top_k: int
    num_pairs: int
    out_pairs: torch.Tensor  # [T*A, H]: one row per (token, slot), summed over slots at the end
    cfg: dict
    sorted_pairs: torch.Tensor
    block_expert: torch.Tensor
    h: torch.Tensor  # [padded pairs, I]: silu(gate) * up, the down GEMM's input


def grouped_launch(x, topk_ids, num_experts: int, inter: int, weight_dtype) -> GroupedLaunch | None:
    """Buffers, launch config and the expert-sorted (token, slot) pairs; None for no tokens."""
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return None
    top_k = topk_ids.shape[1]
    num_pairs = num_tokens * top_k
    out_pairs = torch.zeros(num_pairs, hidden, dtype=x.dtype, device=x.device)
    cfg = launch_config(num_experts, inter, hidden, weight_dtype, x.device, num_tokens)
    sorted_pairs, block_expert = align_by_expert(topk_ids, num_experts, cfg["BLOCK_M"])
    h = torch.empty(sorted_pairs.numel(), inter, dtype=x.dtype, device=x.device)
    return GroupedLaunch(top_k, num_pairs, out_pairs, cfg, sorted_pairs, block_expert, h)


def fused_moe_triton(x, w_gate_up, w_down, topk_weights, topk_ids, *, w1_scale=None, w2_scale=None, block_shape=None):
    """x [T, H]; w_gate_up [E, 2I, H]; w_down [E, H, I]; topk_* [T, A] -> [T, H] in x's dtype."""
    assert x.ndim == 2 and x.is_contiguous(), "x must be contiguous [T, H]"
    assert w_gate_up.is_contiguous() and w_down.is_contiguous(), "expert weights must be contiguous"
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = w_gate_up.shape
    inter = two_inter // 2
    assert w_gate_up.shape[2] == hidden and w_down.shape == (num_experts, hidden, inter), "shape mismatch"
    launch = grouped_launch(x, topk_ids, num_experts, inter, w_gate_up.dtype)
    if launch is None:
        return x.new_zeros(0, hidden)
    top_k, num_pairs, out_pairs, cfg, sorted_pairs, block_expert, h = launch
    dot_fp32 = x.dtype == torch.float32
    s1, s1_strides, mode1, block1 = _scale_args(w1_scale, w_gate_up, block_shape)
    grid = (block_expert.numel(), triton.cdiv(inter, cfg["BLOCK_N"]))
    _gate_up_kernel[grid](x, w_gate_up, s1, h, sorted_pairs, block_expert, num_pairs, hidden, inter, x.stride(0),
                          *w_gate_up.stride(), *s1_strides, TOP_K=top_k, BLOCK_M=cfg["BLOCK_M"],
                          BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], SCALE_MODE=mode1, SCALE_BLOCK=block1,
                          DOT_FP32=dot_fp32, num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 2))
    s2, s2_strides, mode2, block2 = _scale_args(w2_scale, w_down, block_shape)
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    grid = (block_expert.numel(), triton.cdiv(hidden, cfg["BLOCK_N"]))
    _down_kernel[grid](h, w_down, s2, weights, out_pairs, sorted_pairs, block_expert, num_pairs, hidden, inter,
                       *w_down.stride(), *s2_strides, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                       BLOCK_K=cfg["BLOCK_K"], SCALE_MODE=mode2, SCALE_BLOCK=block2, DOT_FP32=dot_fp32,
                       num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 2))
    return out_pairs.view(num_tokens, top_k, hidden).sum(dim=1)
