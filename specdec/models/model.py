"""One decoder-only transformer covering Llama, Qwen2, Qwen3 (dense) and Qwen3-MoE, Mixtral (MoE).

Module names mirror the Hugging Face checkpoints (transformers v5's fused expert layout), so
loading is a plain mapping. The forward takes a flat batch of new tokens from several sequences
(segments), each with its own KV cache and an optional tree mask.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import specdec_kernels as kernels
from specdec.models.config import ModelConfig
from specdec.models.expert_stats import COUNT_EVERY, ExpertStatistics, NativeRoutes
from specdec.models.kvcache import KVCache, under_inference_mode
from specdec.models.ops import (
    CpuLogitsHead,
    Projection,
    apply_rope,
    half_swap,
    input_major,
    rms_norm,
    rope_cos_sin,
    rotate_pairs,
)
from specdec.models.rope import logit_scale, rope_frequencies

# N = new tokens in the flat batch, H = hidden, Hq/Hkv = heads, D = head dim, E = experts


@dataclass
class Segment:
    """The new tokens of one sequence inside a flat batch (they are contiguous, in segment order)."""

    cache: KVCache
    length: int
    tree_mask: torch.Tensor | None = None  # [length, length] bool, ancestor-or-self; None = causal


class StepInput(NamedTuple):
    """One sequence's share of a batched forward: its new tokens and their positions [n], and
    the Segment that places them in its cache."""

    tokens: torch.Tensor
    positions: torch.Tensor
    segment: Segment

    @classmethod
    def next_chunk(cls, ids: list, cache: KVCache, count: int) -> "StepInput":
        """The next `count` of `ids` after those `cache` holds, placed after them."""
        start = cache.length
        feed = ids[start : start + count]
        return cls(torch.tensor(feed), torch.arange(start, start + len(feed)), Segment(cache, len(feed)))


@dataclass
class ForwardOut:
    """What one forward returns: the logits [rows, vocab] fp32; the same logits as the numpy
    array they were written into, when the native step made them; and the inputs of the capture
    layers [N, k*H] for an EAGLE-3 head (None when no layer is captured)."""

    logits: torch.Tensor
    captured: torch.Tensor | None = None
    array: np.ndarray | None = None

    def rows(self):
        """The logits as acceptance reads them: numpy for a CPU forward (a row's argmax and checks
        in torch pay per-op overhead at every step; viewing the tensor costs tens of
        microseconds, the native step's own array nothing), else the tensor."""
        if self.array is not None:
            return self.array
        if self.logits.is_cpu and self.logits.dtype == torch.float32:
            return self.logits.numpy()
        return self.logits


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, weight_in_fp32: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.weight_in_fp32 = eps, weight_in_fp32

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps, self.weight_in_fp32)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.cfg = layer, cfg
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=cfg.o_proj_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        if cfg.attention_sinks:
            self.sinks = nn.Parameter(torch.zeros(cfg.num_heads))
        self.window = cfg.layer_windows[layer] if cfg.layer_windows else 0
        self.scale = cfg.attention_scale  # None: 1/sqrt(head_dim)

    def fuse(self) -> None:
        """For inference: one [q; k; v] projection (three small matmuls cost three dispatches),
        and the query and key heads normed and rotated together (one RMSNorm and one RoPE
        instead of two each: fewer dispatches on every CPU step, with the same results bit for bit)."""
        weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        bias = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]) if self.cfg.attention_bias else None
        self._qkv = Projection(weight.detach(), None if bias is None else bias.detach())
        if self.cfg.qk_norm:  # a plain tensor, not a parameter: it must not join the state dict
            self._qk_norm_weight = torch.cat([self.q_norm.weight.detach().expand(self.cfg.num_heads, -1),
                                              self.k_norm.weight.detach().expand(self.cfg.num_kv_heads, -1)])

    def _queries_keys_values(self, x, cos, sin):
        """q [N, Hq, D], k and v [N, Hkv, D], normed (Qwen3) and rotated."""
        n, cfg = x.shape[0], self.cfg
        heads = cfg.num_heads + cfg.num_kv_heads
        if getattr(self, "_qkv", None) is not None:
            qkv = self._qkv(x).view(n, heads + cfg.num_kv_heads, cfg.head_dim)
            qk, v = qkv[:, :heads], qkv[:, heads:]
            if cfg.qk_norm:
                qk = rms_norm(qk, self._qk_norm_weight, cfg.rms_norm_eps)
            qk = apply_rope(qk, cos, sin)
            return qk[:, : cfg.num_heads], qk[:, cfg.num_heads :], v
        q = self.q_proj(x).reshape(n, cfg.num_heads, cfg.head_dim)
        k = self.k_proj(x).reshape(n, cfg.num_kv_heads, cfg.head_dim)
        v = self.v_proj(x).reshape(n, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x, cos, sin, segments, positions=None):
        return self.o_proj(self.attend(self.project(x, cos, sin), segments, positions))

    def project(self, x, cos, sin):
        """The per-token half, which a compiled step fuses with the layer around it: (q, k, v)."""
        return self._queries_keys_values(x, cos, sin)

    def attend(self, projected, segments, positions=None):
        """The per-sequence half: each segment's keys and values into its cache, its queries
        over its cache -> [N, Hq * D], before o_proj."""
        q, k, v = projected
        sinks = getattr(self, "sinks", None)
        outputs, start = [], 0
        for seg in segments:
            end = start + seg.length
            seg.cache.write(self.layer, k[start:end].transpose(0, 1), v[start:end].transpose(0, 1))
            out = kernels.tree_attention(
                q[start:end].transpose(0, 1)[None],  # [1, Hq, n, D]
                seg.cache.keys[self.layer],
                seg.cache.values[self.layer],
                (seg.cache.length,),
                None if seg.tree_mask is None else seg.tree_mask[None], self.scale,
                sinks=sinks, window=self.window,
                positions=None if positions is None or not self.window else positions[start:end][None],
            )
            outputs.append(out[0].transpose(0, 1).reshape(seg.length, -1))
            start = end
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


class LatentAttention(nn.Module):
    """DeepSeek-V2's multi-head latent attention, computed in its absorbed form.

    The cache holds, per token, the normed compressed latent c [r] and the rotated shared rope
    key k_pe [R] (one kv "head" of width r + R, values read from the same rows). Queries are
    taken into the latent space through kv_b_proj's key half (q_nope W_uk), so the scores
    q_nope . k_nope + q_pe . k_pe come out of one attention over [c, k_pe], and the output,
    a weighted sum of latents, leaves through the value half W_uv. RoPE here rotates
    consecutive pairs, as transformers' DeepSeek-V2 does."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.cfg = layer, cfg
        heads, nope, rope, r = cfg.num_heads, cfg.qk_nope_head_dim, cfg.head_dim, cfg.kv_lora_rank
        if cfg.q_lora_rank:
            self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=cfg.attention_bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, 1e-6)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, heads * (nope + rope), bias=False)
        else:
            self.q_proj = nn.Linear(cfg.hidden_size, heads * (nope + rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, r + rope, bias=cfg.attention_bias)
        self.kv_a_layernorm = RMSNorm(r, 1e-6)
        self.kv_b_proj = nn.Linear(r, heads * (nope + cfg.v_head_dim), bias=False)
        self.o_proj = nn.Linear(heads * cfg.v_head_dim, cfg.hidden_size, bias=cfg.attention_bias)
        self.scale = (nope + rope) ** -0.5 * logit_scale(cfg)

    def forward(self, x, cos, sin, segments, positions=None):
        return self.o_proj(self.attend(self.project(x, cos, sin), segments, positions))

    def project(self, x, cos, sin):
        """(queries [N, Hq, r + R] in the latent space, keys [N, 1, r + R]: latent and rope key)."""
        cfg, n = self.cfg, x.shape[0]
        heads, nope, rope, r = cfg.num_heads, cfg.qk_nope_head_dim, cfg.head_dim, cfg.kv_lora_rank
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if cfg.q_lora_rank else self.q_proj(x)
        q_nope, q_pe = q.view(n, heads, nope + rope).split([nope, rope], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([r, rope], dim=-1)
        half = rope // 2
        q_pe = rotate_pairs(q_pe, cos[:, None, :half], sin[:, None, :half])
        k_pe = rotate_pairs(k_pe[:, None], cos[:, None, :half], sin[:, None, :half])
        keys = torch.cat([self.kv_a_layernorm(latent)[:, None], k_pe], dim=-1)  # [N, 1, r + R]
        w_uk = self.kv_b_proj.weight.view(heads, nope + cfg.v_head_dim, r)[:, :nope]
        queries = torch.cat([torch.einsum("nhd,hdr->nhr", q_nope, w_uk), q_pe], dim=-1)  # [N, Hq, r + R]
        return queries, keys

    def attend(self, projected, segments, positions=None):
        """The latents into each segment's cache, attention over them, out through W_uv -> [N, Hq * v]."""
        queries, keys = projected
        cfg, r = self.cfg, self.cfg.kv_lora_rank
        w_uv = self.kv_b_proj.weight.view(cfg.num_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, r)[:, cfg.qk_nope_head_dim :]
        outputs, start = [], 0
        for seg in segments:
            end = start + seg.length
            seg.cache.write(self.layer, keys[start:end].transpose(0, 1), keys.new_empty(1, end - start, 0))
            cached = seg.cache.keys[self.layer]  # [1, 1, S, r + R]
            out = kernels.tree_attention(queries[start:end].transpose(0, 1)[None], cached, cached[..., :r],
                                         (seg.cache.length,), None if seg.tree_mask is None else seg.tree_mask[None],
                                         scale=self.scale)  # [1, Hq, n, r]
            outputs.append(torch.einsum("hnr,hvr->nhv", out[0], w_uv).reshape(end - start, -1))
            start = end
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


class GeluMLP(nn.Module):
    """StarCoder2's MLP: c_fc, GELU, c_proj, with biases."""

    def __init__(self, hidden: int, intermediate: int, bias: bool, activation: str):
        super().__init__()
        self.c_fc = nn.Linear(hidden, intermediate, bias=bias)
        self.c_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.approximate = "tanh" if activation == "gelu_pytorch_tanh" else "none"

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate))


def norm_for(cfg: ModelConfig, dim: int) -> nn.Module:
    """The family's normalisation: RMSNorm, or LayerNorm with bias (StarCoder2)."""
    if cfg.layer_norm:
        return nn.LayerNorm(dim, eps=cfg.rms_norm_eps)
    return RMSNorm(dim, cfg.rms_norm_eps, cfg.norm_in_fp32)


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Experts(nn.Module):
    """All experts stacked, the layout the fused kernels read."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))  # [E, 2I, H]
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))  # [E, H, I]
        if bias:  # GPT-OSS
            self.gate_up_proj_bias = nn.Parameter(torch.zeros(num_experts, 2 * intermediate))
            self.down_proj_bias = nn.Parameter(torch.zeros(num_experts, hidden))


class SparseMoeBlock(nn.Module):
    COUNT_EVERY = COUNT_EVERY  # forwards whose expert ids are kept before they are summed

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k, self.renormalize, self.routing = cfg.top_k, cfg.norm_topk_prob, cfg.routing
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=cfg.router_bias)
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, cfg.expert_bias)
        self.swiglu = (cfg.swiglu_limit, cfg.swiglu_alpha)
        # Tokens routed to each expert since the last reset, for load-imbalance reports.
        self.register_buffer("tokens_per_expert", torch.zeros(cfg.num_experts, dtype=torch.long), persistent=False)
        # Each forward's expert ids [N, A], kept as they are and counted only when read: counting
        # in every forward cost a few ops a layer, a few percent of a CPU decode step.
        self.latest_ids = None
        self.uncounted_ids: list = []  # summed every COUNT_EVERY forwards, or when read
        if cfg.shared_expert_size:  # Qwen2-MoE, DeepSeek: every token also goes through a dense expert
            self.shared_expert = DenseMLP(cfg.hidden_size, cfg.shared_expert_size)
            if cfg.shared_expert_gated:  # Qwen2-MoE's sigmoid gate
                self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)
        self.groups, self.routed_scale = cfg.expert_groups, cfg.routed_scaling_factor

    def activation(self):
        """The experts' biases and clamped SwiGLU (GPT-OSS), or None for the plain SwiGLU."""
        gate_up_bias = getattr(self.experts, "gate_up_proj_bias", None)
        if gate_up_bias is None and self.swiglu[0] is None:
            return None
        return kernels.ExpertActivation(gate_up_bias, getattr(self.experts, "down_proj_bias", None), *self.swiglu)

    def forward(self, x):
        weights, ids = self.route(x)  # [N, A] each
        if hasattr(self.experts, "run"):  # int8 experts (specdec/models/quantize.py)
            out = self.experts.run(x, weights, ids, self.activation())
        else:
            out = kernels.fused_moe(x, self.experts.gate_up_proj, self.experts.down_proj, weights, ids,
                                    act=self.activation())
        return out + self.shared(x) if hasattr(self, "shared_expert") else out

    def route(self, x):
        """(weights, expert ids) [N, A] of each token, counted into the load statistics."""
        weights, ids = kernels.moe_route(self.gate(x), self.top_k, self.renormalize, self.routing, self.groups)
        if not torch.compiler.is_compiling():  # a compiled step keeps no statistics (specdec/models/compiled.py)
            self.file_ids(ids)
        return (weights * self.routed_scale if self.routed_scale != 1.0 else weights), ids

    def file_ids(self, ids) -> None:
        """Keep an eager forward's expert ids [N, A] for the load statistics (the native step
        files all layers' at once on the model: specdec/models/expert_stats.py)."""
        self.latest_ids = ids
        self.uncounted_ids.append(ids)
        if len(self.uncounted_ids) >= self.COUNT_EVERY:
            self.count_routed()

    def count_routed(self) -> None:
        """Fold the ids kept since the last count into tokens_per_expert."""
        if self.uncounted_ids:
            ids = torch.cat([i.reshape(-1) for i in self.uncounted_ids])
            self.tokens_per_expert += torch.bincount(ids, minlength=self.tokens_per_expert.numel())
            self.uncounted_ids = []

    def shared(self, x):
        """The shared expert's share (call only when there is one)."""
        if hasattr(self, "shared_expert_gate"):
            return torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return self.shared_expert(x)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = norm_for(cfg, cfg.hidden_size)
        self.self_attn = LatentAttention(cfg, layer) if cfg.kv_lora_rank else Attention(cfg, layer)
        self.post_attention_layernorm = norm_for(cfg, cfg.hidden_size)
        if layer in cfg.sparse_layers:
            self.mlp = SparseMoeBlock(cfg)
        elif cfg.gelu_mlp:
            self.mlp = GeluMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.gelu_mlp)
        else:
            self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.residual_multiplier = cfg.residual_multiplier

    def forward(self, x, cos, sin, segments, positions=None):
        return self.post(x, self.self_attn.attend(self.pre(x, cos, sin), segments, positions))

    def pre(self, x, cos, sin):
        """Everything before attention reads the caches: per token, so it compiles."""
        return self.self_attn.project(self.input_layernorm(x), cos, sin)

    def post(self, x, attended):
        """Everything after: o_proj, residual, the MLP or the experts; per token as well."""
        scale = self.residual_multiplier
        h = self.self_attn.o_proj(attended)
        x = x + (h if scale == 1.0 else h * scale)
        h = self.mlp(self.post_attention_layernorm(x))
        return x + (h if scale == 1.0 else h * scale)


class DecoderStack(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = norm_for(cfg, cfg.hidden_size)


def _first(model, input_ids, positions):
    """Embedding, RoPE angles and layer 0's projections -> (x, cos, sin, projected)."""
    x = model.model.embed_tokens(input_ids)
    if model.config.embedding_multiplier != 1.0:
        x = x * model.config.embedding_multiplier
    cos, sin = rope_cos_sin(positions, model.config.head_dim, model.config.rope_theta, x.dtype, model.rope_frequencies)
    return x, cos, sin, model.model.layers[0].pre(x, cos, sin)


def _seam(layer, next_layer, x, attended, cos, sin):
    """From one layer's attention output to the next layer's projections -> (x, projected)."""
    x = layer.post(x, attended)
    return x, next_layer.pre(x, cos, sin)


def _last(model, layer, x, attended, rows):
    """The last layer's rest, the final norm and the logits (fp32) of `rows` (None: all)."""
    x = layer.post(x, attended)
    if rows is not None:
        x = x[rows]
    head = getattr(model, "_lm_head", None) or model.lm_head
    logits = head(model.model.norm(x)).float()
    return logits if model.config.logits_scaling == 1.0 else logits / model.config.logits_scaling


class StepParts(NamedTuple):
    """The per-token stretches of a forward, between the attentions that read each sequence's
    cache: eager here, compiled by specdec/models/compiled.py (same functions, same signatures)."""

    first: Callable
    seam: Callable
    last: Callable


EAGER_STEP = StepParts(_first, _seam, _last)


class Transformer(ExpertStatistics, nn.Module):
    step = EAGER_STEP  # an instance's own StepParts once compiled (specdec/models/compiled.py)
    native_step = None  # short steps (decode, verify, batched users) in one native call (specdec/models/native.py)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = DecoderStack(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tokenizer = None
        self.path = None
        self.capture_layers: tuple = ()  # layers whose input run() returns as ForwardOut.captured [N, k*H]
        # (num_layers: the last layer's output, before the final norm; the native step only)
        self.native_routes = NativeRoutes()
        self.rope_frequencies = rope_frequencies(cfg)  # None: plain RoPE at rope_theta
        # {name: PackedMatrix} when the matrices are packed in 8-bit blocks (specdec.models.packed): they
        # then exist only there (their parameters stay on the meta device) and only the native
        # step runs the model.
        self.packed = None

    def fuse_for_inference(self) -> None:
        for module in self.modules():
            if isinstance(module, Attention):
                module.fuse()
        if self.device.type == "cpu":
            self._input_major_weights()
        # RoPE's half swap made now, outside any compiled step (which must only read it) and any
        # inference-mode forward (whose tensors autograd refuses).
        half_swap(self.config.head_dim, self.dtype, self.device)

    def _input_major_weights(self) -> None:
        """On the CPU, the weights that widen (out > in) are stored input-major: MKL multiplies a
        few rows by them faster that way (the narrowing down_proj is slower that way, and stays).
        Same values and shapes, other strides; the Triton kernels (CUDA) keep the checkpoint layout."""
        for module in self.modules():
            if isinstance(module, Attention):
                module._qkv = Projection(input_major(module._qkv.weight), module._qkv.bias)
            elif isinstance(module, SparseMoeBlock):
                module.experts.gate_up_proj.data = input_major(module.experts.gate_up_proj.data)
            elif isinstance(module, DenseMLP):
                for linear in (module.gate_proj, module.up_proj):
                    linear.weight.data = input_major(linear.weight.data)
        # Tied to the embedding, whose row lookups want the checkpoint layout: a copy of it.
        self._lm_head = CpuLogitsHead(self.lm_head.weight.detach())

    def _apply(self, fn, *args, **kwargs):
        self.native_step = None  # .to(), .float(), .cuda() move the weights it points at
        return super()._apply(fn, *args, **kwargs)

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def dtype(self):
        return torch.float32 if self.packed else self.model.embed_tokens.weight.dtype

    @property
    def device(self):
        return torch.device("cpu") if self.packed else self.model.embed_tokens.weight.device

    def cache_dims(self) -> dict:
        """The KV cache's heads and widths: MLA keeps one latent row per token and no values."""
        cfg = self.config
        if cfg.kv_lora_rank:
            return {"num_kv_heads": 1, "head_dim": cfg.kv_lora_rank + cfg.head_dim, "value_dim": 0}
        return {"num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "value_dim": None}

    def new_cache(self, capacity: int = 256) -> KVCache:
        return KVCache(self.config.num_layers, **self.cache_dims(), dtype=self.dtype, device=self.device,
                       capacity=capacity)

    def forward(self, input_ids, positions, segments, logits_rows=None) -> torch.Tensor:
        """input_ids, positions [N] -> logits [len(logits_rows) or N, vocab] (fp32); run() returns
        the captured features too."""
        return self.run(input_ids, positions, segments, logits_rows).logits

    @under_inference_mode
    def run(self, input_ids, positions, segments, logits_rows=None) -> ForwardOut:
        """input_ids, positions [N] -> ForwardOut: logits [len(logits_rows) or N, vocab] (fp32)
        and the capture layers' inputs.

        Writes the new tokens' keys and values into each segment's cache as pending entries;
        the caller keeps or drops them (KVCache.keep / keep_all).
        """
        if input_ids.numel() == 0:  # nothing new: no rows to write, no logits (the kernels want tokens)
            return ForwardOut(torch.zeros(0, self.config.vocab_size, dtype=torch.float32, device=input_ids.device))
        native = self.native_step
        if native is not None and native.takes(input_ids, segments, logits_rows):
            out = native(input_ids, positions, segments, logits_rows)
            if out is not None:
                return out
        if self.packed:
            raise RuntimeError("this model's weights are packed in 8-bit blocks, which only the native step "
                               "reads, and it could not run this forward")
        if self.config.num_layers in self.capture_layers:
            raise RuntimeError("the last layer's output (capture slot num_layers) is captured by the native step only")
        self.forget_native_routes()
        for seg in segments:
            seg.cache.reserve(seg.length)
        step, layers = self.step, self.model.layers
        x, cos, sin, projected = step.first(self, input_ids, positions)
        inputs = {}
        for i, layer in enumerate(layers):
            if i in self.capture_layers:  # an EAGLE-3 head reads these layers' inputs (all rows)
                inputs[i] = x
            attended = layer.self_attn.attend(projected, segments, positions)
            if i + 1 < len(layers):
                x, projected = step.seam(layer, layers[i + 1], x, attended, cos, sin)
        captured = torch.cat([inputs[i] for i in self.capture_layers], dim=-1) if inputs else None
        rows = None if logits_rows is None else torch.as_tensor(logits_rows, dtype=torch.long, device=x.device)
        last = EAGER_STEP.last if rows is not None and rows.numel() == 0 else step.last  # no need to compile 0 rows
        return ForwardOut(last(self, layers[-1], x, attended, rows), captured)

    def logits(self, input_ids):
        """LongTensor [B, T] -> FloatTensor [B, T, vocab]; plain causal, no cache kept."""
        batch, length = input_ids.shape
        segments = [Segment(self.new_cache(length), length) for _ in range(batch)]
        positions = torch.arange(length, device=input_ids.device).repeat(batch)
        return self(input_ids.reshape(-1), positions, segments).view(batch, length, -1)

    def moe_blocks(self) -> list:
        return self._moe_blocks

    @cached_property
    def _moe_blocks(self) -> list:
        return [m for m in self.modules() if isinstance(m, SparseMoeBlock)]
