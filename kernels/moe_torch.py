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

    x [T, H], w_gate_up [E, 2I, H], w_down [E, H, I]. act: an ExpertActivation for expert
    biases and GPT-OSS's clamped SwiGLU (None: plain SwiGLU). On the CPU, inference runs every
    expert in one grouped matmul per projection (grouped_moe), and one token its k experts in
    turn; elsewhere, and when autograd records (the grouped matmul has no CPU backward), one
    matmul per active expert.
    """
    if x.shape[0] == 1 and not torch.compiler.is_compiling():
        return sum_over_slots(x, topk_weights, topk_ids, lambda rows, e: _expert(x, w_gate_up, w_down, e, act))
    if x.device.type == "cpu" and not (torch.is_grad_enabled() and (x.requires_grad or w_gate_up.requires_grad)):
        return grouped_moe(x, w_gate_up, w_down, topk_weights, topk_ids, act)
    return _per_expert(x, w_gate_up, w_down, topk_weights, topk_ids, act)


def sum_over_slots(x, topk_weights, topk_ids, run_expert):
    """Decode: one token, its top-k experts one after another (the grouped matmul would visit
    every expert, most of them with no rows). run_expert(rows, expert) -> [1, H], rows None:
    the token itself."""
    out = None
    for expert, weight in zip(topk_ids[0].tolist(), topk_weights[0].to(x.dtype), strict=True):
        y = run_expert(None, expert) * weight
        out = y if out is None else out + y
    return out


def sum_over_experts(x, topk_weights, topk_ids, num_experts: int, run_expert):
    """Tokens grouped by expert, run_expert(rows, expert) -> [len(rows), H] once per active
    expert over all its tokens (rows: their indices in x; experts with no tokens skipped)."""
    num_tokens, top_k = topk_ids.shape
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
        y = run_expert(pairs // top_k, expert)  # [c, H]
        per_pair.index_copy_(0, pairs, y * flat_weights[pairs, None])
    return per_pair.view(num_tokens, top_k, -1).sum(dim=1)


def grouped_moe(x, w_gate_up, w_down, topk_weights, topk_ids, act=None):
    """The MoE with no Python loop and no host sync: the (token, slot) pairs are sorted by
    expert, each projection is ONE grouped matmul over the sorted rows (torch._grouped_mm, with
    each expert's row range given as offsets), and each pair's output is written back to its
    slot once, so no accumulating scatter. Every shape depends only on T, which lets a
    compiled step (specdec/models/compiled.py) trace it."""
    num_tokens, top_k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1)  # [T*A]
    order = torch.argsort(flat_ids, stable=True)  # pairs sorted by expert
    experts = torch.arange(w_gate_up.shape[0], device=x.device)
    offsets = torch.cumsum((flat_ids[:, None] == experts).sum(0), 0, dtype=torch.int32)  # [E] row ends
    rows = x[order // top_k]
    y = _grouped_swiglu(rows, w_gate_up, w_down, offsets, flat_ids[order], act)
    y = y * topk_weights.reshape(-1)[order, None].to(y.dtype)
    per_pair = torch.empty_like(y).index_copy_(0, order, y)
    return per_pair.view(num_tokens, top_k, -1).sum(dim=1)


def _grouped_swiglu(rows, w_gate_up, w_down, offsets, row_experts, act):
    """rows [R, H] sorted by expert -> [R, H]. Under torch.compile the same computation is an
    opaque custom op: the grouped matmul's shape function accepts only bf16, though the CPU
    kernel runs every dtype."""
    bias_up = None if act is None else act.gate_up_bias
    bias_down = None if act is None else act.down_bias
    limit = None if act is None else act.limit
    alpha = 1.702 if act is None else act.alpha
    if torch.compiler.is_compiling():
        return grouped_swiglu_op(rows, w_gate_up, w_down, offsets, row_experts, bias_up, bias_down, limit, alpha)
    return _grouped_swiglu_eager(rows, w_gate_up, w_down, offsets, row_experts, bias_up, bias_down, limit, alpha)


def _grouped_swiglu_eager(rows, w_gate_up, w_down, offsets, row_experts, bias_up, bias_down, limit, alpha):
    h = torch._grouped_mm(rows, w_gate_up.transpose(-1, -2), offs=offsets)  # [R, 2I]
    if bias_up is not None:
        h = h + bias_up[row_experts]
    hidden = swiglu(h, limit, alpha)
    out = torch._grouped_mm(hidden, w_down.transpose(-1, -2), offs=offsets)  # [R, H]
    return out if bias_down is None else out + bias_down[row_experts]


@torch.library.custom_op("specdec_kernels::grouped_swiglu", mutates_args=())
def grouped_swiglu_op(rows: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, offsets: torch.Tensor,
                      row_experts: torch.Tensor, bias_up: torch.Tensor | None, bias_down: torch.Tensor | None,
                      limit: float | None, alpha: float) -> torch.Tensor:
    return _grouped_swiglu_eager(rows, w_gate_up, w_down, offsets, row_experts, bias_up, bias_down, limit, alpha)


@grouped_swiglu_op.register_fake
def _(rows, w_gate_up, w_down, offsets, row_experts, bias_up, bias_down, limit, alpha):
    return rows.new_empty(rows.shape[0], w_down.shape[1])


def _per_expert(x, w_gate_up, w_down, topk_weights, topk_ids, act=None):
    """One matmul per active expert: the path where the grouped matmul is unavailable, and for training."""
    return sum_over_experts(x, topk_weights, topk_ids, w_gate_up.shape[0],
                            lambda rows, e: _expert(x[rows], w_gate_up, w_down, e, act))


class ExpertActivation:
    """What an expert adds to the plain SwiGLU: biases after each projection ([E, 2I], [E, H])
    and GPT-OSS's clamp: gate <= limit, -limit <= up <= limit, (up + 1) * gate * sigmoid(alpha * gate)."""

    def __init__(self, gate_up_bias=None, down_bias=None, limit: float | None = None, alpha: float = 1.702):
        self.gate_up_bias, self.down_bias, self.limit, self.alpha = gate_up_bias, down_bias, limit, alpha


def swiglu(h, limit: float | None = None, alpha: float = 1.702):
    """h [R, 2I], gate then up -> [R, I]: silu(gate) * up, or with a limit GPT-OSS's clamped form."""
    gate, up = h.chunk(2, dim=-1)
    if limit is None:
        return F.silu(gate) * up
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def _expert(rows, w_gate_up, w_down, expert: int, act: ExpertActivation | None):
    if act is None:
        return F.linear(swiglu(F.linear(rows, w_gate_up[expert])), w_down[expert])
    bias = None if act.gate_up_bias is None else act.gate_up_bias[expert]
    hidden = swiglu(F.linear(rows, w_gate_up[expert], bias), act.limit, act.alpha)
    return F.linear(hidden, w_down[expert], None if act.down_bias is None else act.down_bias[expert])
