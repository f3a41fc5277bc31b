"""Chooses, per call, whether an operation runs as a Triton kernel or as its PyTorch reference."""

import os

import torch

_CHOICES = ("auto", "triton", "torch")


def backend_for(tensor: torch.Tensor) -> str:
    """'triton' or 'torch' for an operation on `tensor`, honouring SPECDEC_KERNELS.

    auto (the default) sends CUDA tensors to Triton and everything else to PyTorch;
    triton forces the kernels (with TRITON_INTERPRET=1 they run on CPU tensors too).
    """
    choice = os.environ.get("SPECDEC_KERNELS", "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"SPECDEC_KERNELS={choice!r}: expected one of {', '.join(_CHOICES)}")
    if choice == "auto":
        return "triton" if tensor.is_cuda else "torch"
    return choice
