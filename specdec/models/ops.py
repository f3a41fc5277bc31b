"""The small numerical pieces the model's layers share: RMSNorm's arithmetic, RoPE, and
projections held outside the state dict."""

import torch
import torch.nn.functional as F


def rms_norm(x, weight, eps: float, weight_in_fp32: bool = False):
    # Normalised in fp32 as the reference implementations do, so that bf16/fp16 agree with
    # them; GPT-OSS also multiplies by the weight before casting back (weight_in_fp32).
    # (F.rms_norm is one op, but on the CPU it runs these same five inside, and was no faster.)
    if x.dtype == torch.float32:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    x32 = x.float()
    if weight_in_fp32:
        return (weight.float() * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Projection:
    """A weight and bias applied as F.linear, held outside the state dict: the fused qkv and the
    CPU's input-major copy of a tied lm_head. specdec/models/quantize.py swaps in int8 ones."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight, self.bias = weight, bias

    def __call__(self, x):
        return F.linear(x, self.weight, self.bias)


class CpuLogitsHead(Projection):
    """The CPU's lm_head: one row (decode, the end of a prefill) through an input-major copy of
    the weight, which MKL multiplies a single row by fastest; several rows (a verify pass's tree)
    as weight @ x.T in the checkpoint's layout, which reads the vocabulary's rows once for all
    of them where the input-major product grew with every row (a 4-token tree's logits: about a
    fifth of its forward)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__(input_major(weight))
        self.output_major = weight

    def __call__(self, x):
        if x.shape[0] == 1:
            return F.linear(x, self.weight)
        return torch.mm(self.output_major, x.t()).t().contiguous()


def input_major(weight: torch.Tensor) -> torch.Tensor:
    """weight [..., out, in] with the same values, stored as [..., in, out] (a transposed view)."""
    return weight.transpose(-1, -2).contiguous().transpose(-1, -2)


def rope_inverse_frequencies(head_dim: int, theta: float, frequencies=None, device=None):
    """(inv_freq [D/2], attention factor): a scaled RoPE's `frequencies` (specdec.models.rope), else
    plain RoPE's at `theta`."""
    if frequencies is None:
        return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)), 1.0
    inv_freq, factor = frequencies
    return inv_freq.to(device), factor


def rope_cos_sin(positions, head_dim: int, theta: float, dtype, frequencies=None):
    """cos, sin [N, D] for rotate-half RoPE at the given positions; frequencies: (inv_freq [D/2],
    attention factor) of a scaled RoPE (specdec.models.rope), else plain RoPE at `theta`."""
    inv_freq, factor = rope_inverse_frequencies(head_dim, theta, frequencies, positions.device)
    freqs = positions.float()[:, None] * inv_freq[None]  # [N, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    if factor == 1.0:
        return emb.cos().to(dtype), emb.sin().to(dtype)
    return (emb.cos() * factor).to(dtype), (emb.sin() * factor).to(dtype)


def apply_rope(x, cos, sin):
    """x [N, heads, D]. The rotation's half swap with a sign, (-x2, x1), is one matmul by a
    signed permutation (exact: one nonzero term a sum), where slicing, negating and
    concatenating took four ops."""
    return x * cos[:, None] + (x @ half_swap(x.shape[-1], x.dtype, x.device)) * sin[:, None]


_HALF_SWAPS: dict = {}


def half_swap(dim: int, dtype, device) -> torch.Tensor:
    key = (dim, dtype, device)
    swap = _HALF_SWAPS.get(key)
    if swap is None:
        with torch.inference_mode(False):  # a plain tensor: training reads it under autograd
            half, rows = dim // 2, torch.arange(dim // 2)
            swap = torch.zeros(dim, dim)
            swap[rows + half, rows] = -1.0  # output i < half takes -x[i + half]
            swap[rows, rows + half] = 1.0  # output i >= half takes x[i - half]
            swap = _HALF_SWAPS[key] = swap.to(dtype=dtype, device=device)
    return swap


def rotate_pairs(x, cos, sin):
    """RoPE on consecutive pairs (x[2i], x[2i+1]) by angle i; cos, sin [N, 1, D/2]."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
