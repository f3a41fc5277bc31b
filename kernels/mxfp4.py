"""MXFP4 expert weights (OCP microscaling): e2m1 values, two per byte, one e8m0 scale per 32.

Layout, for a weight the model stores as [E, N, K] (rows N, reduction K):
  packed [E, N, K/2] uint8   element 2j in the low nibble of byte j, element 2j+1 in the high
  scales [E, N, K/32] uint8  e8m0: the 32 elements of a group are multiplied by 2**(s - 127)
An e2m1 nibble is a sign bit and one of 0, 0.5, 1, 1.5, 2, 3, 4, 6.

On Blackwell (compute capability 10) the grouped GEMMs read these weights as they are through
tl.dot_scaled, whose tensor-core path exists only there; everywhere else (Hopper, the PyTorch
path) the weights are dequantised to the activations' dtype first and the ordinary kernels run.
Under TRITON_INTERPRET=1 the dot_scaled kernels run on the CPU, for the tests.
"""

import os

import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
GROUP = 32


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """packed [E, N, K/2] uint8, scales [E, N, K/32] uint8 -> [E, N, K] in dtype."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32, device=packed.device)
    low, high = (packed & 0x0F).long(), (packed >> 4).long()
    values = torch.stack((table[low], table[high]), dim=-1).flatten(-2)  # [E, N, K]
    factor = torch.exp2(scales.float() - 127.0).repeat_interleave(GROUP, dim=-1)
    return (values * factor).to(dtype)


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] float -> (packed, scales): round to nearest e2m1 after a per-group power-of-two
    scale chosen so that the group's largest magnitude fits (OCP MX's shared exponent)."""
    e, n, k = weight.shape
    assert k % GROUP == 0, f"K={k} must be a multiple of {GROUP} for MXFP4"
    groups = weight.float().reshape(e, n, k // GROUP, GROUP)
    amax = groups.abs().amax(-1).clamp_min(2.0**-126)
    exponent = torch.floor(torch.log2(amax)) - 2  # 6 = 1.5 * 2**2 is the largest e2m1 value
    exponent = exponent.clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)[..., None]
    magnitudes = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=weight.device)
    index = (scaled.abs()[..., None] - magnitudes).abs().argmin(-1)
    nibbles = (index | ((scaled < 0).long() << 3)).reshape(e, n, k)
    packed = (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).to(torch.uint8)
    return packed, (exponent + 127).to(torch.uint8)


def uses_dot_scaled(x: torch.Tensor) -> bool:
    """The native MXFP4 path: Blackwell GPUs, or the interpreter (tests)."""
    if x.is_cuda:
        return torch.cuda.get_device_capability(x.device)[0] == 10
    return os.environ.get("TRITON_INTERPRET") == "1"
