"""PyTorch MoE routing and expert computation: the CPU path and the reference the Triton kernels are tested against."""

import torch
import torch.nn.functional as F

# T = num_tokens, E = num_experts, H = hidden dim, I = expert intermediate dim, A = active experts (top_k)


def moe_route_torch(router_logits: torch.Tensor, top_k: int, renormalize: bool, mode: str = "softmax_topk",
                    groups: tuple = ()):
    """Softmax over experts in fp32, top-k, optional renormalisation -> (weights [T, A], ids [T, A]).
    mode "topk_softmax" (GPT-OSS): top-k on the logits, then a softmax over those k.
    groups (n_group, topk_group) (DeepSeek's group-limited greedy): the experts form n_group
    groups, and only the topk_group groups with the best single expert score are chosen from."""
    if mode == "topk_softmax":
        values, ids = torch.topk(router_logits, top_k, dim=-1)
        return torch.softmax(values, dim=-1, dtype=torch.float32), ids
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # [T, E]
    if groups:
        n_group, topk_group = groups
        best = probs.view(probs.shape[0], n_group, -1).amax(dim=-1)  # [T, G]
        chosen = torch.zeros_like(best, dtype=torch.bool).scatter_(1, torch.topk(best, topk_group, dim=-1).indices, True)
        probs = probs.masked_fill(~chosen.repeat_interleave(probs.shape[1] // n_group, dim=1), 0.0)
    weights, ids = torch.topk(probs, top_k, dim=-1)  # [T, A]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def fused_moe_torch(x, w_gate_up, w_down, topk_weights, topk_ids, act=None):
    """sum_a w[t, a] * down_e(silu(gate_e(x_t)) * up_e(x_t)) with e = ids[t, a].

    Tokens are grouped by expert so that every active expert runs one matmul over all its
    tokens; experts with no tokens are skipped. x [T, H], w_gate_up [E, 2I, H], w_down [E, H, I].
    act: an ExpertActivation for expert biases and GPT-OSS's clamped SwiGLU (None: plain SwiGLU).
    """
    num_tokens, top_k = topk_ids.shape
    num_experts = w_gate_up.shape[0]
    if num_tokens == 1:
        return _single_token(x, w_gate_up, w_down, topk_weights, topk_ids, act)
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
        y = _expert(x[tokens], w_gate_up, w_down, expert, act)  # [c, H]
        per_pair.index_copy_(0, pairs, y * flat_weights[pairs, None])
    return per_pair.view(num_tokens, top_k, -1).sum(dim=1)


def _single_token(x, w_gate_up, w_down, topk_weights, topk_ids, act=None):
    """Decode fast path: one token, its top-k experts one after another (no sorting or scatter)."""
    out = None
    for expert, weight in zip(topk_ids[0].tolist(), topk_weights[0].to(x.dtype), strict=True):
        y = _expert(x, w_gate_up, w_down, expert, act) * weight
        out = y if out is None else out + y
    return out


class ExpertActivation:
    """What an expert adds to the plain SwiGLU: biases after each projection ([E, 2I], [E, H])
    and GPT-OSS's clamp: gate <= limit, -limit <= up <= limit, (up + 1) * gate * sigmoid(alpha * gate)."""

    def __init__(self, gate_up_bias=None, down_bias=None, limit: float | None = None, alpha: float = 1.702):
        self.gate_up_bias, self.down_bias, self.limit, self.alpha = gate_up_bias, down_bias, limit, alpha


def _expert(rows, w_gate_up, w_down, expert: int, act: ExpertActivation | None):
    if act is None:
        gate, up = F.linear(rows, w_gate_up[expert]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, w_down[expert])
    bias = None if act.gate_up_bias is None else act.gate_up_bias[expert]
    gate, up = F.linear(rows, w_gate_up[expert], bias).chunk(2, dim=-1)
    if act.limit is None:
        hidden = F.silu(gate) * up
    else:
        gate, up = gate.clamp(max=act.limit), up.clamp(-act.limit, act.limit)
        hidden = (up + 1) * (gate * torch.sigmoid(gate * act.alpha))
    return F.linear(hidden, w_down[expert], None if act.down_bias is None else act.down_bias[expert])
