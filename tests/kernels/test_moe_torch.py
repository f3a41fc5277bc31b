"""The CPU MoE: one grouped matmul per projection equals one matmul per expert, for every
token count, with GPT-OSS's biases and clamp, with experts that get no tokens, and under
autograd (which takes the per-expert path)."""

import pytest
import torch

from specdec_kernels.moe_torch import ExpertActivation, _per_expert, fused_moe_torch, grouped_moe, moe_route_torch


def _experts(num_experts=6, hidden=40, inter=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(num_experts, 2 * inter, hidden, generator=g) / hidden**0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=g) / inter**0.5
    return w1, w2


def _reference(x, w1, w2, weights, ids, act=None):
    """Token by token, slot by slot: nothing shared with either implementation."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for a in range(ids.shape[1]):
            e = int(ids[t, a])
            h = w1[e] @ x[t] + (0 if act is None or act.gate_up_bias is None else act.gate_up_bias[e])
            gate, up = h.chunk(2)
            if act is None or act.limit is None:
                hidden = torch.nn.functional.silu(gate) * up
            else:
                gate, up = gate.clamp(max=act.limit), up.clamp(-act.limit, act.limit)
                hidden = (up + 1) * gate * torch.sigmoid(gate * act.alpha)
            y = w2[e] @ hidden + (0 if act is None or act.down_bias is None else act.down_bias[e])
            out[t] += weights[t, a] * y
    return out


@pytest.mark.parametrize("tokens", [1, 2, 5, 33])
def test_grouped_equals_per_token_reference(tokens):
    w1, w2 = _experts()
    x = torch.randn(tokens, 40, generator=torch.Generator().manual_seed(tokens))
    weights, ids = moe_route_torch(torch.randn(tokens, 6), 2, True)
    expected = _reference(x, w1, w2, weights, ids)
    torch.testing.assert_close(grouped_moe(x, w1, w2, weights, ids), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused_moe_torch(x, w1, w2, weights, ids), expected, atol=1e-5, rtol=1e-5)


def test_grouped_with_idle_experts_and_gpt_oss_activation():
    w1, w2 = _experts()
    act = ExpertActivation(torch.randn(6, 48), torch.randn(6, 40), limit=0.5, alpha=1.702)
    x = torch.randn(7, 40)
    ids = torch.tensor([[0, 3]] * 7)  # experts 1, 2, 4, 5 get nothing
    weights = torch.softmax(torch.randn(7, 2), dim=-1)
    expected = _reference(x, w1, w2, weights, ids, act)
    torch.testing.assert_close(grouped_moe(x, w1, w2, weights, ids, act), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_per_expert(x, w1, w2, weights, ids, act), expected, atol=1e-5, rtol=1e-5)


def test_input_major_weights_give_the_same_result():
    w1, w2 = _experts()
    x = torch.randn(9, 40)
    weights, ids = moe_route_torch(torch.randn(9, 6), 2, False)
    input_major = w1.transpose(-1, -2).contiguous().transpose(-1, -2)  # as the CPU model stores gate_up
    torch.testing.assert_close(grouped_moe(x, input_major, w2, weights, ids), grouped_moe(x, w1, w2, weights, ids))


def test_training_takes_the_differentiable_path():
    w1, w2 = (w.requires_grad_() for w in _experts())
    x = torch.randn(5, 40)
    weights, ids = moe_route_torch(torch.randn(5, 6), 2, True)
    out = fused_moe_torch(x, w1, w2, weights, ids)
    out.sum().backward()
    assert w1.grad is not None and w1.grad.abs().sum() > 0
    torch.testing.assert_close(out.detach(), _reference(x, w1.detach(), w2.detach(), weights, ids), atol=1e-5, rtol=1e-5)
