"""A step of a few new tokens in one native call: a Transformer's weights bound to kernels/cpu_decode.c.

A forward of a few new tokens (plain decoding, a draft's steps, a verify pass over a token
tree, several users' steps batched together, a short prompt chunk riding along) is where a
small model on the CPU spends its time in dispatch, not arithmetic; the native step runs it
whole, reading each weight row once for all the sequences' tokens. Longer forwards (prompt
prefill) stay eager, where each op is large enough to carry its dispatch.

The binding reads the model's weights where they lie, in the layout fuse_for_inference left
them (input-major or not); where bf16 holds a matrix's values exactly it also keeps a bf16 copy
at the same strides, which the products read in half the bytes for the same numbers. A weight
edited in place after binding (param.copy_, load_state_dict) makes the copies stale: the step
then declines every forward, which runs eagerly, until `bind(model)` is called again. It
covers the families whose layers are plain enough: fp32 on the CPU, RMSNorm, grouped-query attention with optional q/k norms and biases,
plain or scaled RoPE, dense SwiGLU or softmax-top-k SwiGLU experts; `unsupported()` names
what stops any other model, which then decodes eagerly. Anything that rewrites the weights or
the forward after loading (int8, expert-parallel shards, the compiled step) drops the binding.
"""

import ctypes
import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

from specdec.models.model import Attention, DenseMLP, ForwardOut, SparseMoeBlock, Transformer
from specdec.models.ops import CpuLogitsHead, Projection, rope_inverse_frequencies
from specdec_kernels import cpu_decode

log = logging.getLogger(__name__)

MAX_TOKENS = 256  # longer steps (a whole prompt's prefill) run faster in MKL's GEMM and SDPA


class NativeStep:
    """Callable: (input_ids, positions, segments, logits_rows) -> ForwardOut; writes each segment's
    new keys and values into its cache as pending rows, as the eager forward does."""

    def __init__(self, model: Transformer, lib, halves: bool = True):
        """halves=False: never make bf16 copies (the products then read fp32, same numbers)."""
        cfg, self.lib, self.model = model.config, lib, model
        self.packed = model.packed  # {name: PackedMatrix} or None
        self.moe_blocks = [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, SparseMoeBlock)]
        self.keep = []  # tensors whose addresses the descriptors hold
        self.reads_bf16 = halves and bool(lib.specdec_reads_bf16())
        self.half_bytes = 0  # the bf16 copies' size
        self.copied = []  # the fp32 weights copied: an in-place edit (a new version) makes a copy stale
        self.stale = False
        layers = (cpu_decode.Layer * cfg.num_layers)(*(self._layer(i, layer) for i, layer in enumerate(model.model.layers)))
        self.capture_layers, self.capture = (), torch.zeros(0, dtype=torch.int32)
        inv_freq, factor = rope_inverse_frequencies(cfg.head_dim, cfg.rope_theta, model.rope_frequencies, "cpu")
        inv_freq = inv_freq.to(torch.float32).contiguous()
        self.keep += [layers, inv_freq]
        if self.packed:
            embed, embed_quant = None, ctypes.pointer(self.packed["embed"].desc)
            lm_head = cpu_decode.Mat.packed(self.packed["lm_head"].desc)
        else:
            head = getattr(model, "_lm_head", None)
            embed, embed_quant = cpu_decode.pointer(model.model.embed_tokens.weight), None
            lm_head = self._mat(head.output_major if isinstance(head, CpuLogitsHead) else model.lm_head.weight)
        self.desc = cpu_decode.Model(
            cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size,
            max(layer.gate.rows for layer in layers), cfg.top_k if self.moe_blocks else 0,
            int(bool(cfg.norm_topk_prob)), cfg.rms_norm_eps,
            cfg.head_dim ** -0.5 if cfg.attention_scale is None else cfg.attention_scale, float(factor),
            embed, embed_quant, cpu_decode.pointer(model.model.norm.weight),
            lm_head, inv_freq.data_ptr(), layers, None)
        self.desc_ref = ctypes.byref(self.desc)
        self.embed, self.embed_ptr = model.model.embed_tokens, model.model.embed_tokens.weight.data_ptr()
        self.copied_versions = [weight._version for weight in self.copied]
        self.vocab, self.top_k, self.hidden = cfg.vocab_size, max(cfg.top_k, 1), cfg.hidden_size

    def _layer(self, index: int, layer) -> cpu_decode.Layer:
        if self.packed:
            return self._packed_layer(index, layer)
        attn, mlp = layer.self_attn, layer.mlp
        qkv_bias, o_bias = attn._qkv.bias, attn.o_proj.bias
        desc = cpu_decode.Layer(
            attn_norm=cpu_decode.pointer(layer.input_layernorm.weight),
            post_norm=cpu_decode.pointer(layer.post_attention_layernorm.weight),
            qkv=self._mat(attn._qkv.weight), qkv_bias=cpu_decode.pointer(qkv_bias),
            qk_norm=cpu_decode.pointer(getattr(attn, "_qk_norm_weight", None)),
            o=self._mat(attn.o_proj.weight), o_bias=cpu_decode.pointer(o_bias))
        if isinstance(mlp, SparseMoeBlock):
            gate_up, down = mlp.experts.gate_up_proj.detach(), mlp.experts.down_proj.detach()
            intermediate = down.shape[2]
            router = mlp.gate.weight.detach().contiguous()
            self.keep.append(router)
            desc.num_experts, desc.router = gate_up.shape[0], cpu_decode.Mat.of(router)
            desc.router_bias = cpu_decode.pointer(mlp.gate.bias)
            gate_up_half, down_half = self._half_copy(gate_up), self._half_copy(down)
            desc.gate = cpu_decode.Mat.of(gate_up[0, :intermediate], _first(gate_up_half, slice(None, intermediate)))
            desc.up = cpu_decode.Mat.of(gate_up[0, intermediate:], _first(gate_up_half, slice(intermediate, None)))
            desc.down = cpu_decode.Mat.of(down[0], _first(down_half, slice(None)))
            desc.gate_up_expert_stride, desc.down_expert_stride = gate_up.stride(0), down.stride(0)
        else:
            desc.gate, desc.up = self._mat(mlp.gate_proj.weight), self._mat(mlp.up_proj.weight)
            desc.down = self._mat(mlp.down_proj.weight)
        return desc

    def _packed_layer(self, index: int, layer) -> cpu_decode.Layer:
        """A layer whose matrices are packed: the descriptors point into model.packed; the
        fused qkv bias and q/k norm weights are made here (small)."""
        attn, cfg, mat = layer.self_attn, self.model.config, lambda part: self.packed[f"{index}.{part}"].desc
        qkv_bias = None
        if cfg.attention_bias:
            qkv_bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).detach().contiguous()
        qk_norm = None
        if cfg.qk_norm:
            qk_norm = torch.cat([attn.q_norm.weight.detach().expand(cfg.num_heads, -1),
                                 attn.k_norm.weight.detach().expand(cfg.num_kv_heads, -1)]).contiguous()
        self.keep += [qkv_bias, qk_norm]
        return cpu_decode.Layer(
            attn_norm=cpu_decode.pointer(layer.input_layernorm.weight),
            post_norm=cpu_decode.pointer(layer.post_attention_layernorm.weight),
            qkv=cpu_decode.Mat.packed(mat("qkv")), qkv_bias=cpu_decode.pointer(qkv_bias),
            qk_norm=cpu_decode.pointer(qk_norm), o=cpu_decode.Mat.packed(mat("o")),
            o_bias=cpu_decode.pointer(None if attn.o_proj.bias is None else attn.o_proj.bias.detach()),
            gate=cpu_decode.Mat.packed(mat("gate")), up=cpu_decode.Mat.packed(mat("up")),
            down=cpu_decode.Mat.packed(mat("down")))

    def _mat(self, weight: torch.Tensor) -> cpu_decode.Mat:
        """A matrix's descriptor, with a bf16 copy of it where one holds its values exactly."""
        return cpu_decode.Mat.of(weight.detach(), self._half_copy(weight))

    def _half_copy(self, weight: torch.Tensor) -> torch.Tensor | None:
        """The weight in bf16 at the same strides, when bf16 holds every value exactly (a bf16
        checkpoint loaded in fp32) and the library reads it; else None. The step then reads half
        the bytes for the very same numbers, so its logits do not change."""
        if not self.reads_bf16:
            return None
        half = torch.empty_strided(weight.shape, weight.stride(), dtype=torch.bfloat16)
        half.copy_(weight.detach())
        if not torch.equal(half.float(), weight):
            return None
        self.keep.append(half)
        self.copied.append(weight)
        self.half_bytes += half.untyped_storage().nbytes()
        return half

    def takes(self, input_ids, segments, logits_rows) -> bool:
        """Whether a forward is one it runs: at most MAX_TOKENS new tokens over all its
        sequences, some logits wanted (decode steps or verify passes), and the weights still
        where they were bound (Transformer._apply drops the binding; this catches an assigned
        state dict)."""
        if self.packed:  # nothing else can run it; long forwards go in chunks
            return True
        if input_ids.numel() > MAX_TOKENS or (logits_rows is not None and len(logits_rows) == 0):
            return False
        if self.stale or [weight._version for weight in self.copied] != self.copied_versions:
            if not self.stale:
                log.warning("weights edited in place after the native step was bound: decoding eagerly "
                            "until specdec.models.native.bind(model) is called again")
            self.stale = True
            return False
        return self.embed._parameters["weight"].data_ptr() == self.embed_ptr  # the dict: Module.__getattr__ costs more

    def __call__(self, input_ids, positions, segments, logits_rows=None) -> ForwardOut | None:
        """As Transformer.run: input_ids, positions [n] (the segments' tokens, in segment order)
        -> ForwardOut (logits [len(logits_rows) or n, V]), or None when the step must run eagerly."""
        if input_ids.numel() > MAX_TOKENS:
            return self._in_chunks(input_ids, positions, segments, logits_rows)
        return self._run(input_ids, positions, segments, logits_rows)

    def _in_chunks(self, input_ids, positions, segments, logits_rows) -> ForwardOut | None:
        """A forward of more than MAX_TOKENS tokens (a packed model's prefill) as calls of at
        most MAX_TOKENS, segment by segment: a segment's later chunks attend over its earlier
        chunks' keys, already in its cache as pending rows."""
        wanted = list(range(input_ids.numel())) if logits_rows is None else [int(r) for r in logits_rows]
        out = np.empty((len(wanted), self.vocab), dtype=np.float32)
        captured, start = [], 0
        for segment in segments:
            if segment.tree_mask is not None and segment.length > MAX_TOKENS:
                raise ValueError(f"a token tree of {segment.length} nodes is more than one native call takes")
            segment.cache.reserve(segment.length)
            for done in range(0, segment.length, MAX_TOKENS):
                size, low = min(MAX_TOKENS, segment.length - done), start + done
                slots = [i for i, row in enumerate(wanted) if low <= row < low + size]
                part = _Chunk(segment.cache, size, segment.tree_mask, done)
                part_out = self._run(input_ids[low:low + size], positions[low:low + size], [part],
                                     [wanted[i] - low for i in slots])
                if part_out is None:  # its scratch memory was refused: the caller decides
                    return None
                out[slots] = part_out.array
                if part_out.captured is not None:
                    captured.append(part_out.captured)
            start += segment.length
        return ForwardOut(torch.from_numpy(out), torch.cat(captured) if captured else None, out)

    def _run(self, input_ids, positions, segments, logits_rows) -> ForwardOut | None:
        if self.capture_layers != self.model.capture_layers:  # an EAGLE-3 head attached or left
            self.capture_layers = tuple(self.model.capture_layers)
            self.capture = torch.tensor(self.capture_layers, dtype=torch.int32)  # slot -> layer, repeats allowed
            self.desc.capture, self.desc.capture_count = self.capture.data_ptr(), len(self.capture_layers)
        n = input_ids.numel()
        seqs, masks = self._sequences(segments)
        rows = None if logits_rows is None else torch.as_tensor(logits_rows, dtype=torch.long)
        array = np.empty((n if rows is None else rows.numel(), self.vocab), dtype=np.float32)
        logits = torch.from_numpy(array)
        ids = torch.empty(len(self.moe_blocks), n, self.top_k, dtype=torch.long)
        captured = torch.empty(n, len(self.capture_layers) * self.hidden) if self.capture_layers else None
        if positions.dtype is not torch.long:  # a no-op .to() still costs a dispatch, at every step
            positions = positions.to(torch.long)
        tokens, positions = input_ids.contiguous(), positions.contiguous()
        status = self.lib.specdec_forward(
            self.desc_ref, len(segments), seqs, n, tokens.data_ptr(), positions.data_ptr(),
            None if rows is None else rows.data_ptr(), logits.shape[0], logits.data_ptr(), ids.data_ptr(),
            None if captured is None else captured.data_ptr(), torch.get_num_threads())
        del masks  # held until the call returned: the descriptors point into them
        if status:  # its scratch memory (attention scores grow with the cache) was refused
            log.warning("the native step could not allocate its scratch memory; this step runs eagerly")
            return None
        if self.moe_blocks:
            self.model.file_native_routes(ids)
        return ForwardOut(logits, captured, array)

    @staticmethod
    def _sequences(segments):
        """The C descriptors of the segments (each cache grown for its new tokens), and the
        uint8 tree masks they point into."""
        seqs, masks = (cpu_decode.Seq * len(segments))(), []
        for seq, segment in zip(seqs, segments, strict=True):
            cache, chunk = segment.cache, isinstance(segment, _Chunk)
            if not chunk:  # a chunk's cache was reserved for its whole segment
                cache.reserve(segment.length)
            mask = None
            if segment.tree_mask is not None and segment.length > 1:
                mask = segment.tree_mask.to(torch.uint8).contiguous()
                masks.append(mask)
            seq.keys, seq.values, seq.capacity = cache.keys.data_ptr(), cache.values.data_ptr(), cache.capacity
            seq.length, seq.n = cache.length + (segment.offset if chunk else 0), segment.length
            seq.mask = None if mask is None else mask.data_ptr()
        return seqs, masks


@dataclass
class _Chunk:
    """Part of a segment's new tokens: `length` of them, after its first `offset` new ones."""

    cache: object
    length: int
    tree_mask: torch.Tensor | None
    offset: int


def _first(experts: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    """Expert 0's rows of a stacked expert tensor's bf16 copy (None stays None)."""
    return None if experts is None else experts[0, rows]


def unsupported(model: Transformer) -> str | None:
    """Why the native step cannot run `model`, or None when it can."""
    cfg = model.config
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return f"{model.dtype} on {model.device} (the native step is fp32 on the CPU)"
    if cfg.layer_norm or cfg.residual_multiplier != 1.0 or cfg.embedding_multiplier != 1.0 or cfg.logits_scaling != 1.0:
        return "LayerNorm or scaled residuals, embeddings or logits"
    if cfg.head_dim % 2 or cfg.num_heads % cfg.num_kv_heads:
        return "odd head dimension or uneven query groups"
    head = getattr(model, "_lm_head", None)
    if head is not None and not isinstance(head, CpuLogitsHead):
        return "a quantized lm_head"
    for layer in model.model.layers:
        reason = _layer_unsupported(layer, bool(model.packed))
        if reason:
            return reason
    return None


def _layer_unsupported(layer, packed: bool = False) -> str | None:
    attn, mlp = layer.self_attn, layer.mlp
    if type(attn) is not Attention or (not packed and type(getattr(attn, "_qkv", None)) is not Projection):
        return "latent attention, or attention not fused for inference"
    if packed and type(mlp) is not DenseMLP:
        return f"a {type(mlp).__name__} MLP with packed weights (dense SwiGLU MLPs only)"
    if hasattr(attn, "sinks") or attn.window:
        return "attention sinks or a sliding window"
    if type(mlp) is SparseMoeBlock:
        if mlp.routing != "softmax_topk" or mlp.groups or mlp.routed_scale != 1.0 or hasattr(mlp, "shared_expert"):
            return "routing other than softmax top-k, or a shared expert"
        if mlp.activation() is not None or hasattr(mlp.experts, "run"):
            return "expert biases, a clamped SwiGLU or quantized experts"
        if mlp.experts.gate_up_proj.shape[0] > cpu_decode.MAX_EXPERTS or mlp.top_k > cpu_decode.MAX_TOP_K:
            return "more experts than the native step routes"
    elif type(mlp) is not DenseMLP:
        return f"a {type(mlp).__name__} MLP"
    return None


def enabled() -> bool:
    """False under SPECDEC_NATIVE=0, which keeps every model eager."""
    return os.environ.get("SPECDEC_NATIVE", "1") != "0"


def bind(model: Transformer) -> bool:
    """Give `model` the native step where it can run; True when it did.
    SPECDEC_NATIVE=0 keeps every model eager."""
    model.native_step = None
    if not enabled():
        return False
    reason = unsupported(model)
    if reason:
        log.info("decoding %s eagerly: %s", model.path or "a model", reason)
        return False
    lib = cpu_decode.library()
    if lib is None:
        return False
    model.native_step = NativeStep(model, lib)
    return True
