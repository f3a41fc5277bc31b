"""MXFP4 experts: the format's round trip, the dot_scaled kernels (interpreter) against the
PyTorch reference on the same dequantised weights, and the fallback path."""

import os

import pytest
import torch

import specdec_kernels as kernels
from specdec_kernels.moe_torch import fused_moe_torch, moe_route_torch
from specdec_kernels.mxfp4 import E2M1_VALUES, dequantize_mxfp4, quantize_mxfp4


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-12)).item()


def test_representable_values_round_trip_exactly():
    values = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES))
    weight = (values[torch.randint(0, 16, (3, 4, 64))] * 2.0**-3).float()
    weight[..., 0] = 6 * 2.0**-3  # every group holds its largest magnitude, so the scale is exact
    weight[..., 32] = -6 * 2.0**-3
    packed, scales = quantize_mxfp4(weight)
    assert packed.shape == (3, 4, 32) and scales.shape == (3, 4, 2) and packed.dtype == torch.uint8
    assert torch.equal(dequantize_mxfp4(packed, scales), weight)


def test_quantisation_error_is_that_of_four_bit_values():
    weight = torch.randn(2, 16, 128)
    restored = dequantize_mxfp4(*quantize_mxfp4(weight))
    error = ((restored - weight).abs().mean() / weight.abs().mean()).item()
    assert 0.02 < error < 0.2


def _inputs(tokens, experts, hidden, inter, k, empty=()):
    x = torch.randn(tokens, hidden).to(torch.float16)
    w1, w2 = torch.randn(experts, 2 * inter, hidden) / hidden**0.5, torch.randn(experts, hidden, inter) / inter**0.5
    logits = torch.randn(tokens, experts)
    for e in empty:
        logits[:, e] = -1e9
    weights, ids = moe_route_torch(logits, k, True)
    return x, quantize_mxfp4(w1), quantize_mxfp4(w2), weights, ids


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the dot_scaled kernels need TRITON_INTERPRET=1 here")
@pytest.mark.parametrize("tokens,experts,hidden,inter,k,empty", [
    (1, 4, 64, 32, 2, ()),  # a single token
    (13, 8, 64, 96, 2, (1, 6)),  # ragged, experts with no tokens, I not a power of two
])
def test_dot_scaled_kernels_match_the_dequantised_reference(tokens, experts, hidden, inter, k, empty, monkeypatch):
    from specdec_kernels.triton_mxfp4 import fused_moe_mxfp4_triton

    x, (p1, s1), (p2, s2), weights, ids = _inputs(tokens, experts, hidden, inter, k, empty)
    got = fused_moe_mxfp4_triton(x, p1, s1, p2, s2, weights, ids)
    ref = fused_moe_torch(x.float(), dequantize_mxfp4(p1, s1), dequantize_mxfp4(p2, s2), weights, ids)
    assert rel_err(got, ref) < 3e-3
    kernels.set_backend("triton")  # the public entry point takes the same path
    assert torch.equal(kernels.fused_moe(x, p1, p2, weights, ids, w1_scale=s1, w2_scale=s2), got)


def test_without_dot_scaled_the_weights_are_dequantised(monkeypatch):
    kernels.set_backend("torch")
    x, (p1, s1), (p2, s2), weights, ids = _inputs(6, 4, 64, 32, 2)
    x = x.float()
    got = kernels.fused_moe(x, p1, p2, weights, ids, w1_scale=s1, w2_scale=s2)
    ref = fused_moe_torch(x, dequantize_mxfp4(p1, s1), dequantize_mxfp4(p2, s2), weights, ids)
    assert rel_err(got, ref) < 1e-5
    with pytest.raises(ValueError, match="e8m0 scales"):
        kernels.fused_moe(x, p1, p2, weights, ids)
