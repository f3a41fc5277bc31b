"""SPECDEC_KERNELS picks the implementation; both give the same answers through the public names."""

import pytest
import torch

import specdec_kernels as kernels
from specdec_kernels.dispatch import backend_for, configure_from_environment, set_backend


def test_backend_choice(monkeypatch):
    cpu = torch.zeros(1)
    monkeypatch.delenv("SPECDEC_KERNELS", raising=False)
    configure_from_environment()
    assert backend_for(cpu) == "torch"
    monkeypatch.setenv("SPECDEC_KERNELS", "triton")
    configure_from_environment()
    assert backend_for(cpu) == "triton"
    monkeypatch.setenv("SPECDEC_KERNELS", "torch")
    assert backend_for(cpu) == "triton"  # read once, at load: a later change of the variable is not seen
    monkeypatch.setenv("SPECDEC_KERNELS", "cuda-magic")
    with pytest.raises(ValueError, match="SPECDEC_KERNELS"):
        configure_from_environment()


def test_public_names_agree_across_backends(monkeypatch):
    x = torch.randn(6, 32)
    w1, w2 = torch.randn(4, 64, 32) / 6, torch.randn(4, 32, 32) / 6
    logits = torch.randn(6, 4)
    out = {}
    for backend in ("torch", "triton"):
        set_backend(backend)
        weights, ids = kernels.moe_route(logits, 2, True)
        out[backend] = kernels.fused_moe(x, w1, w2, weights, ids)
    assert torch.allclose(out["torch"], out["triton"], rtol=1e-4, atol=1e-5)


def test_fp8_torch_path_dequantizes(monkeypatch):
    set_backend("torch")
    w = torch.randn(2, 256, 128)
    scale = w.abs().amax(dim=2) / 448
    q = (w / scale[..., None]).to(torch.float8_e4m3fn)
    deq = kernels.dequantize(q, scale, None, torch.float32)
    assert ((deq - w).abs().max() / w.abs().max()) < 0.07  # e4m3 keeps 3 mantissa bits
