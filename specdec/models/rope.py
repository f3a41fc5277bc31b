"""Scaled rotary position embeddings: YaRN (GPT-OSS, DeepSeek, long-context Qwen).

YaRN keeps the high-frequency dimensions as trained (extrapolation), divides the low-frequency
ones by the context factor (interpolation), ramps linearly between the two over the dimensions
whose wavelengths fall between beta_fast and beta_slow rotations of the original context, and
scales cos and sin by an attention factor (0.1 ln(factor) + 1 by default, or the ratio of two
such terms with DeepSeek's mscale and mscale_all_dim).
"""

import math

import torch


def rope_frequencies(cfg) -> tuple[torch.Tensor, float] | None:
    """(inv_freq [D/2], attention factor) for a config with YaRN scaling, None for plain RoPE."""
    params = cfg.rope_scaling
    if not params:
        return None
    dim, base = cfg.head_dim, cfg.rope_theta
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or cfg.max_position_embeddings / original
    low, high = _correction_range(params.get("beta_fast") or 32, params.get("beta_slow") or 1, dim, base, original,
                                  params.get("truncate", True))
    exponents = torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim  # real even when the model is built on meta
    extrapolated = 1.0 / base**exponents
    interpolated = extrapolated / factor
    keep = 1 - _ramp(low, high, dim // 2)  # 1: as trained, 0: interpolated
    inv_freq = interpolated * (1 - keep) + extrapolated * keep
    return inv_freq, _attention_factor(params, factor)


def logit_scale(cfg) -> float:
    """DeepSeek's YaRN also scales the attention logits, by mscale(factor, mscale_all_dim)^2."""
    params = cfg.rope_scaling or {}
    all_dim = params.get("mscale_all_dim")
    return _mscale(params.get("factor") or 1.0, all_dim) ** 2 if all_dim else 1.0


def _attention_factor(params: dict, factor: float) -> float:
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all:
        return _mscale(factor, mscale) / _mscale(factor, mscale_all)
    return _mscale(factor)


def _mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _correction_range(fast: float, slow: float, dim: int, base: float, context: int, truncate: bool):
    """The dimensions (fractional unless truncated) where beta_fast and beta_slow rotations fit the context."""
    def dimension(rotations: float) -> float:
        return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(base))
    low, high = dimension(fast), dimension(slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _ramp(low: float, high: float, size: int) -> torch.Tensor:
    if low == high:
        high += 0.001
    return ((torch.arange(size, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
