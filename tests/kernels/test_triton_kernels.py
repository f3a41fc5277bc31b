"""Each Triton kernel, run by the interpreter on the CPU, against its PyTorch reference."""

import os

import pytest
import torch

from specdec_kernels.attention_torch import tree_attention_torch
from specdec_kernels.moe_torch import fused_moe_torch, moe_route_torch
from specdec_kernels.triton_attention import tree_attention_triton
from specdec_kernels.triton_moe import align_by_expert, fused_moe_triton, moe_route_triton

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs a GPU or TRITON_INTERPRET=1")
TOLERANCE = {torch.float32: 1e-4, torch.float16: 3e-3}


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-12)).item()


@pytest.mark.parametrize("tokens,experts,k,renorm", [(1, 8, 2, True), (7, 8, 2, False), (33, 16, 4, True), (5, 6, 1, True)])
def test_route(tokens, experts, k, renorm):
    logits = torch.randn(tokens, experts)
    w, ids = moe_route_triton(logits, k, renorm)
    rw, rids = moe_route_torch(logits, k, renorm)
    assert torch.equal(ids, rids)
    assert rel_err(w, rw) < 1e-5


def test_alignment_pads_each_expert_and_skips_empty_ones():
    ids = torch.tensor([[0, 3], [3, 0], [3, 1]])  # expert 2 has no tokens
    sorted_pairs, block_expert = align_by_expert(ids, num_experts=4, block_m=4)
    assert block_expert.tolist() == [0, 1, 3]
    blocks = sorted_pairs.view(-1, 4).tolist()
    assert blocks[0][:2] == [0, 3] and blocks[0][2:] == [6, 6]  # 6 = padding (number of pairs)
    assert blocks[1] == [5, 6, 6, 6] and blocks[2][:3] == [1, 2, 4]


def _moe_inputs(tokens, experts, hidden, inter, k, dtype, empty_experts=()):
    x = torch.randn(tokens, hidden).to(dtype)
    w1 = (torch.randn(experts, 2 * inter, hidden) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter) / inter**0.5).to(dtype)
    logits = torch.randn(tokens, experts)
    for e in empty_experts:
        logits[:, e] = -1e9
    weights, ids = moe_route_torch(logits, k, True)
    return x, w1, w2, weights, ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("tokens,experts,hidden,inter,k,empty", [
    (1, 8, 64, 32, 2, ()),  # a single token
    (19, 8, 64, 48, 2, (2, 5)),  # ragged sizes, experts with no tokens
    (40, 4, 32, 64, 1, ()),
])
def test_fused_moe(dtype, tokens, experts, hidden, inter, k, empty):
    x, w1, w2, weights, ids = _moe_inputs(tokens, experts, hidden, inter, k, dtype, empty)
    got = fused_moe_triton(x, w1, w2, weights, ids)
    ref = fused_moe_torch(x.float(), w1.float(), w2.float(), weights, ids)
    assert got.dtype == dtype
    assert rel_err(got, ref) < TOLERANCE[dtype]


def _quantize_fp8(w, block=None):
    """(fp8 weights, scales) per output channel, or per block x block tile."""
    fmax = torch.finfo(torch.float8_e4m3fn).max
    if block is None:
        scale = w.abs().amax(dim=2).clamp(min=1e-8) / fmax  # [E, N]
        q = (w / scale[..., None]).to(torch.float8_e4m3fn)
        return q, scale, q.float() * scale[..., None]
    e, n, kdim = w.shape
    tiles = w.view(e, n // block, block, kdim // block, block)
    scale = tiles.abs().amax(dim=(2, 4)).clamp(min=1e-8) / fmax  # [E, N/b, K/b]
    q = (tiles / scale[:, :, None, :, None]).to(torch.float8_e4m3fn)
    deq = (q.float() * scale[:, :, None, :, None]).view(e, n, kdim)
    return q.view(e, n, kdim), scale, deq


@pytest.mark.parametrize("block", [None, 128])
def test_fused_moe_fp8_weights(block):
    x, w1, w2, weights, ids = _moe_inputs(9, 4, 256, 128, 2, torch.float32, (1,))
    q1, s1, d1 = _quantize_fp8(w1, block)
    q2, s2, d2 = _quantize_fp8(w2, block)
    got = fused_moe_triton(x, q1, q2, weights, ids, w1_scale=s1, w2_scale=s2,
                           block_shape=None if block is None else (block, block))
    ref = fused_moe_torch(x, d1, d2, weights, ids)  # the same quantisation, dequantised
    assert rel_err(got, ref) < 1e-4


def _ancestor_mask(parents):
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tree_attention_batch_of_ragged_sequences(dtype):
    batch, hq, hkv, d, capacity = 3, 4, 2, 32, 600
    parents = [-1, 0, 1, 0, 3, 3, 1]
    tree = len(parents)
    q = torch.randn(batch, hq, tree, d).to(dtype)
    k = torch.randn(batch, hkv, capacity, d).to(dtype)
    v = torch.randn(batch, hkv, capacity, d).to(dtype)
    lens = [0, 37, 530]  # empty prefix, short, long (several splits)
    mask = torch.stack([_ancestor_mask(parents)] * batch)
    got = tree_attention_triton(q, k, v, lens, mask)
    ref = tree_attention_torch(q.float(), k.float(), v.float(), lens, mask)
    assert rel_err(got, ref) < TOLERANCE[dtype]


def test_tree_attention_causal_single_token_and_ragged_q_lens():
    q = torch.randn(2, 2, 5, 16)
    k, v = torch.randn(2, 1, 64, 16), torch.randn(2, 1, 64, 16)
    got = tree_attention_triton(q, k, v, [10, 3], None)
    assert rel_err(got, tree_attention_torch(q, k, v, [10, 3], None)) < 1e-4
    one = tree_attention_triton(q[:, :, :1], k, v, [10, 3], None)
    assert rel_err(one, tree_attention_torch(q[:, :, :1], k, v, [10, 3], None)) < 1e-4
    ragged = tree_attention_triton(q, k, v, [10, 3], None, q_lens=[5, 2])
    second = tree_attention_torch(q[1:, :, :2], k[1:], v[1:], [3], None)
    assert rel_err(ragged[1:, :, :2], second) < 1e-4
