"""Chooses whether an operation runs as a Triton kernel or as its PyTorch reference.

The choice is read once, when the engine loads (configure_from_environment), not on every call:
SPECDEC_KERNELS=auto (the default) sends CUDA tensors to Triton and everything else to PyTorch;
triton forces the kernels (with TRITON_INTERPRET=1 they run on CPU tensors too); torch forces
the references.
"""

import os

import torch

CHOICES = ("auto", "triton", "torch")
_choice = "auto"


def set_backend(choice: str) -> None:
    global _choice
    choice = (choice or "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"SPECDEC_KERNELS={choice!r}: expected one of {', '.join(CHOICES)}")
    _choice = choice


def configure_from_environment() -> str:
    """Read SPECDEC_KERNELS into the process-wide choice; returns it."""
    set_backend(os.environ.get("SPECDEC_KERNELS", "auto"))
    return _choice


def backend_for(tensor: torch.Tensor) -> str:
    """'triton' or 'torch' for an operation on `tensor`, by the configured choice."""
    if _choice == "auto":
        return "triton" if tensor.is_cuda else "torch"
    return _choice


configure_from_environment()
