"""PyTorch MoE routing and expert computation: the CPU path and the reference the Triton kernels are tested against."""

import torch
import torch.nn.functional as F

# T = num_tokens, E = num_experts, H = hidden dim, I = expert intermediate dim, A = active experts (top_k)


def moe_route_torch(router_logits: torch.Tensor, top_k: int, renormalize: bool):
    """Softmax over experts in fp32, top-k, optional renormalisation -> (weights [T, A], ids [T, A])."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # [T, E]
    weights, ids = torch.topk(probs, top_k, dim=-1)  # [T, A]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def fused_moe_torch(x, w_gate_up, w_down, topk_weights, topk_ids):
    """sum_a w[t, a] * down_e(silu(gate_e(x_t)) * up_e(x_t)) with e = ids[t, a].

    Tokens are grouped by expert so that every active expert runs one matmul over all its
    tokens; experts with no tokens are skipped. x [T, H], w_gate_up [E, 2I, H], w_down [E, H, I].
    """
    num_tokens, top_k = topk_ids.shape
    num_experts = w_gate_up.shape[0]
    if num_tokens == 1:
        return _single_token(x, w_gate_up, w_down, topk_weights, topk_ids)
    flat_ids = topk_ids.reshape(-1)  # [T*A]
    order = torch.argsort(flat_ids, stable=True)  # (token, slot) pairs sorted by expert
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    flat_weights = topk_weights.reshape(-1).to(x.dtype)
    # One row per (token, slot) pair: each pair is written once, so no accumulating scatter.
    per_pair = x.new_empty(num_tokens * top_k, x.shape[1])
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        pairs = order[start : start + count]
        start += count
        tokens = pairs // top_k
        gate, up = F.linear(x[tokens], w_gate_up[expert]).chunk(2, dim=-1)  # [c, I] each
        y = F.linear(F.silu(gate) * up, w_down[expert])  # [c, H]
        per_pair.index_copy_(0, pairs, y * flat_weights[pairs, None])
    return per_pair.view(num_tokens, top_k, -1).sum(dim=1)


def _single_token(x, w_gate_up, w_down, topk_weights, topk_ids):
    """Decode fast path: one token, its top-k experts one after another (no sorting or scatter)."""
    out = None
    for expert, weight in zip(topk_ids[0].tolist(), topk_weights[0].to(x.dtype), strict=True):
        gate, up = F.linear(x, w_gate_up[expert]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w_down[expert]) * weight
        out = y if out is None else out + y
    return out
