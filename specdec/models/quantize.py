"""int8 weights for the CPU (`--quantize int8`): a quarter of fp32's bytes for a memory-bound step.

Weights are int8 per output channel (absmax / 127). Activations are quantized per row, also
absmax, and multiplied in integers (torch._int_mm, int32 accumulation), then scaled back:

    y[r, n] = (xq[r] . wq[n]) * sx[r] * sw[n] + b[n]

Because each row is quantized on its own and integer sums are exact, an int8 matmul's output
row does not depend on which other rows share it: a token verified in a tree of 16 goes through
the same int8 arithmetic as decoded alone. The parts left in fp32 (attention, routers, norms)
vary with the batch's shape at rounding level, as they do in an fp32 model, so greedy
speculation is as lossless to the quantized target as it is to the fp32 one. (Dynamic
quantization with one scale over the whole batch, as fbgemm's quantized linear does, would
move a token's logits by a whole quantization step with its neighbours.)

Quantized: the attention projections, dense and expert MLPs, and the lm_head. Kept in fp32:
embeddings, norms, the routers (an expert flip costs more than their few bytes save), and
multi-head latent attention, whose up-projection is read as a matrix, not through a linear.
"""

from pathlib import Path

import torch
from torch import nn

from specdec.models import native
from specdec.models.model import Attention, DenseMLP, GeluMLP, SparseMoeBlock, Transformer
from specdec.models.ops import Projection
from specdec_kernels.moe_torch import sum_over_experts, sum_over_slots, swiglu

QUANTIZATIONS = ("auto", "none", "int8", "blocks")


class Int8Weight:
    """An [out, in] weight as int8 [in, out] (the layout torch._int_mm reads) with fp32 scales."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        weight = weight.detach().float()
        self.scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127  # [out]
        self.qweight = torch.round(weight / self.scale[:, None]).clamp(-127, 127).to(torch.int8).t().contiguous()
        self.bias = None if bias is None else bias.detach().float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply(*quantize_rows(x))

    def apply(self, xq: torch.Tensor, x_scale: torch.Tensor) -> torch.Tensor:
        """Rows already quantized (shared by the experts that read the same rows)."""
        shape = xq.shape
        y = (torch._int_mm(xq.reshape(-1, shape[-1]), self.qweight) * self.scale).mul_(x_scale.reshape(-1, 1))
        y = y.view(*shape[:-1], self.qweight.shape[1])
        return y if self.bias is None else y.add_(self.bias)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] fp32 -> (int8 [..., K], scale [..., 1]): each row by its own absmax. (Written
    in few ops, in place where it can be: a decode step quantizes about twenty rows of inputs.)"""
    scale = torch.linalg.vector_norm(x, ord=float("inf"), dim=-1, keepdim=True).clamp_(min=1e-12).div_(127)
    return torch.div(x, scale).round_().to(torch.int8), scale


class Int8Linear(nn.Module):
    """An nn.Linear's drop-in with int8 weights."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight_int8 = Int8Weight(linear.weight, linear.bias)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x):
        return self.weight_int8(x)


class Int8Experts(nn.Module):
    """Stacked experts with int8 weights, one pair of Int8Weights per expert. Each token's rows
    are quantized once and shared by its k experts' gate_up projections."""

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor):
        super().__init__()
        self.gate_up = [Int8Weight(w) for w in gate_up]
        self.down = [Int8Weight(w) for w in down]

    def run(self, x, topk_weights, topk_ids, act=None):
        xq, x_scale = quantize_rows(x)
        if x.shape[0] == 1:  # decode: the token's k experts in turn, no sorting or scatter
            return sum_over_slots(x, topk_weights, topk_ids, lambda rows, e: self._expert(e, xq, x_scale, act))
        return sum_over_experts(x, topk_weights, topk_ids, len(self.gate_up),
                                lambda rows, e: self._expert(e, xq[rows], x_scale[rows], act))

    def _expert(self, expert: int, xq, x_scale, act):
        h = self.gate_up[expert].apply(xq, x_scale)
        if act is not None and act.gate_up_bias is not None:
            h = h + act.gate_up_bias[expert]
        hidden = swiglu(h) if act is None else swiglu(h, act.limit, act.alpha)
        out = self.down[expert](hidden)
        return out if act is None or act.down_bias is None else out + act.down_bias[expert]


def quantize_int8(model: Transformer) -> Transformer:
    """Quantize `model` in place (CPU, fp32 activations) and return it."""
    if model.device.type != "cpu" or model.dtype != torch.float32:
        raise ValueError(f"quantize int8 runs on the CPU in float32; this model is {model.dtype} on {model.device}")
    if _sharded(model):
        raise ValueError("quantize int8 does not run with --expert-parallel: the shards exchange fp32 experts' rows")
    for module in list(model.modules()):
        if isinstance(module, Attention):
            if getattr(module, "_qkv", None) is not None:
                module._qkv = Int8Weight(module._qkv.weight, module._qkv.bias)
            module.o_proj = Int8Linear(module.o_proj)
        elif isinstance(module, DenseMLP):
            for name in ("gate_proj", "up_proj", "down_proj"):
                setattr(module, name, Int8Linear(getattr(module, name)))
        elif isinstance(module, GeluMLP):
            module.c_fc, module.c_proj = Int8Linear(module.c_fc), Int8Linear(module.c_proj)
        elif isinstance(module, SparseMoeBlock):
            experts = module.experts
            quantized = Int8Experts(experts.gate_up_proj, experts.down_proj)
            for name in ("gate_up_proj_bias", "down_proj_bias"):  # GPT-OSS: activation() reads them
                if hasattr(experts, name):
                    quantized.register_buffer(name, getattr(experts, name).detach())
            module.experts = quantized
    head = getattr(model, "_lm_head", None)
    model._lm_head = Int8Weight(head.weight if isinstance(head, Projection) else model.lm_head.weight)
    model.quantization = "int8"
    native.bind(model)  # the native step reads fp32 weights: int8 decodes eagerly
    return model


def loads_packed(target, quantization: str) -> bool:
    """Whether the target is loaded with packed weights (specdec.models.packed): "blocks" asks for it,
    and "auto" takes it for a GGUF file on the CPU where the native step builds (integer
    products on the file's own blocks, about a fifth of a float step's time)."""
    from specdec.models.gguf_checkpoint import is_gguf
    from specdec_kernels import cpu_decode

    if quantization == "blocks":
        return True
    return (quantization == "auto" and target is not None and is_gguf(Path(target))
            and native.enabled() and cpu_decode.library() is not None)


def quantize_target(model: Transformer, quantization: str) -> Transformer:
    """The --quantize flag: "none", "int8" (refused with a message where it cannot run), or
    "auto": int8 for a float32 target on the CPU that has no native step, where int8 is
    faster at every step size and moves held-out bits per character by +0.0002
    (bench/int8_quality.py), and none elsewhere. The native fp32 step decodes several times
    faster than eager int8, which would give it up (bench/bench_decode.py)."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantize {quantization!r}: expected one of {', '.join(QUANTIZATIONS)}")
    if model.packed:  # packed when loaded (loads_packed)
        return model
    if quantization == "blocks":
        raise ValueError("quantize 'blocks': packed weights are made at load, from a GGUF file "
                         "(load_model(FILE, packed=True))")
    if quantization == "auto":
        fits = (model.device.type == "cpu" and model.dtype == torch.float32 and not _sharded(model)
                and model.native_step is None)
        quantization = "int8" if fits else "none"
    return quantize_int8(model) if quantization == "int8" else model


def _sharded(model: Transformer) -> bool:
    """Whether the MoE layers are expert-parallel shards (a subclass with its own forward)."""
    return any(isinstance(m, SparseMoeBlock) and type(m) is not SparseMoeBlock for m in model.modules())
