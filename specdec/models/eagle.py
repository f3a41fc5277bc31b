"""EAGLE-3 draft heads in the layout SGLang and vLLM load (LlamaForCausalLMEagle3).

A head is one Llama-style decoder layer that reads the target's own hidden states instead of
re-reading the text. Step 0 at a position fuses three of the target's hidden states there (low,
middle, high layers; `fc` maps 3 x H_t to H) with the embedding of the token that follows it;
later steps feed the head's own output back in place of the fused features:

    g = fc(cat(aux_low, aux_mid, aux_high))            step 0 ([N, 3H_t] -> [N, H])
    x = cat(input_layernorm(embed(next token)), hidden_norm(g))      [N, 2H]
    h = g + o_proj(attention(q, k, v from x))           (residual hidden_norm(g) with norm_before_residual)
    h = h + mlp(post_attention_layernorm(h))            the head's output, fed back at the next step
    logits = lm_head(norm(h))                           over the draft vocabulary
    target id = draft id + d2t[draft id]

Tensors: fc.weight [H, 3H_t]; midlayer.self_attn.{q,k,v}_proj.weight [.., 2H], o_proj;
midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}.weight; midlayer.mlp.{gate,
up, down}_proj.weight; norm.weight; lm_head.weight [V_d, H]; d2t int64 [V_d]; t2d bool [V]
(unused at inference); embed_tokens.weight usually absent (the target's is used).
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from specdec.models.config import ConfigError
from specdec.models.kvcache import KVCache, under_inference_mode
from specdec.models.model import RMSNorm
from specdec.models.ops import apply_rope, rope_cos_sin

ARCHITECTURE = "LlamaForCausalLMEagle3"


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    target_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    aux_layers: tuple | None  # target layers whose INPUT is captured; None: (2, L // 2, L - 3)
    norm_before_residual: bool

    @classmethod
    def from_dict(cls, raw: dict) -> "Eagle3Config":
        if ARCHITECTURE not in (raw.get("architectures") or []):
            raise ConfigError(f"not an EAGLE-3 head: architectures {raw.get('architectures')!r}")
        hidden, heads = raw["hidden_size"], raw["num_attention_heads"]
        eagle = raw.get("eagle_config") or {}
        # eagle_aux_hidden_state_layer_ids name "the output of layer X" (SGLang), which is the
        # input of layer X + 1.
        ids = eagle.get("eagle_aux_hidden_state_layer_ids") or raw.get("eagle_aux_hidden_state_layer_ids")
        return cls(hidden_size=hidden, target_hidden_size=raw.get("target_hidden_size") or hidden,
                   num_heads=heads, num_kv_heads=raw.get("num_key_value_heads") or heads,
                   head_dim=raw.get("head_dim") or hidden // heads, intermediate_size=raw["intermediate_size"],
                   vocab_size=raw["vocab_size"], draft_vocab_size=raw.get("draft_vocab_size") or raw["vocab_size"],
                   rms_norm_eps=raw.get("rms_norm_eps", 1e-6), rope_theta=float(raw.get("rope_theta", 10000.0)),
                   aux_layers=tuple(i + 1 for i in ids) if ids else None,
                   norm_before_residual=bool(raw.get("norm_before_residual", False)))

    def capture_layers(self, target_layers: int) -> tuple:
        return self.aux_layers or (2, target_layers // 2, target_layers - 3)


def is_eagle3(path) -> bool:
    config = Path(path) / "config.json"
    return config.exists() and ARCHITECTURE in (json.loads(config.read_text()).get("architectures") or [])


class _Attention(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)

    def forward(self, x, positions, cache: KVCache):
        c, n = self.c, x.shape[0]
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta, x.dtype)
        q = apply_rope(self.q_proj(x).view(n, c.num_heads, c.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(n, c.num_kv_heads, c.head_dim), cos, sin)
        v = self.v_proj(x).view(n, c.num_kv_heads, c.head_dim)
        start = cache.length
        cache.reserve(n)
        cache.write(0, k.transpose(0, 1), v.transpose(0, 1))
        keys, values = cache.keys[0][:, :, : start + n], cache.values[0][:, :, : start + n]
        visible = torch.ones(n, start + n, dtype=torch.bool, device=x.device).tril(start)
        out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys, values, attn_mask=visible, enable_gqa=True)
        return self.o_proj(out[0].transpose(0, 1).reshape(n, -1))


class _MLP(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = _Attention(c)
        self.mlp = _MLP(c)


class Eagle3Head(nn.Module):
    def __init__(self, c: Eagle3Config, embedding_device=None):
        """embedding_device "meta": no embedding of its own is made (one is given after, as
        pack_for_cpu gives a packed target's)."""
        super().__init__()
        self.config = c
        self.fc = nn.Linear(3 * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = _MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, device=embedding_device)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.packed = False  # its products on 8-bit blocks (pack_for_cpu)

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype  # the norms stay floats when the matrices are packed

    def new_cache(self, capacity: int = 256) -> KVCache:
        c = self.config
        return KVCache(1, c.num_kv_heads, c.head_dim, dtype=self.dtype, device=self.norm.weight.device,
                       capacity=capacity)

    @under_inference_mode
    def forward(self, next_tokens, features, positions, cache: KVCache, fused: bool = False):
        """next_tokens [N], features [N, 3H_t] (fused=False: the target's) or [N, H] (the head's own
        output), positions [N] -> (draft-vocabulary logits [N, V_d], the head's output [N, H])."""
        h = self.advance(next_tokens, features, positions, cache, fused)
        return self.logits(h), h

    def logits(self, h):
        """The head's output [N, H] -> draft-vocabulary logits [N, V_d]."""
        return self.lm_head(self.norm(h)).float()

    @under_inference_mode
    def advance(self, next_tokens, features, positions, cache: KVCache, fused: bool = False):
        """forward without the LM head: the head's output [N, H], its cache extended by N rows.
        Bringing the cache up to a prompt needs no logits, and the draft vocabulary's product
        is about a third of a row's work."""
        g = features if fused else self.fc(features)
        layer = self.midlayer
        normed = layer.hidden_norm(g)
        x = torch.cat([layer.input_layernorm(self.embed_tokens(next_tokens)), normed], dim=-1)
        residual = normed if self.config.norm_before_residual else g
        h = residual + layer.self_attn(x, positions, cache)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        cache.keep_all()
        return h

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> the target's ids."""
        return draft_ids + self.d2t[draft_ids]

    def kept(self) -> torch.Tensor:
        """The target ids of the draft vocabulary, in draft-id order."""
        return self.to_target(torch.arange(self.config.draft_vocab_size, device=self.d2t.device))


def target_weight(target, name: str) -> torch.Tensor:
    """A target's parameter by name (the embedding, the LM head) as floats; a packed target's is
    read from its GGUF file (its own stays in 8-bit blocks, which only the native step reads)."""
    if name == "lm_head.weight" and target.config.tie_word_embeddings:
        name = "model.embed_tokens.weight"  # a tied file stores the embedding alone
    weight = target.get_parameter(name)
    if weight.device.type != "meta":
        return weight.detach()
    from specdec.models.gguf_checkpoint import GgufCheckpoint

    return GgufCheckpoint(Path(target.path)).float_tensor(name)


def pack_for_cpu(head: Eagle3Head, target) -> bool:
    """Run a head's products on 8-bit blocks, as its packed target's: each matrix packed, the
    embedding read from the target's packed one. True when it did; a head whose widths are not
    whole blocks, an unpacked target or no native library leaves the head as it was.

    A drafting step is a few one-row products, where reading fp32 weights costs four bytes per
    weight; packed they cost one. Drafts stay drafts: the output is still the target's own."""
    from specdec.models.packed import PackedEmbedding
    from specdec_kernels import cpu_decode

    lib = cpu_decode.library() if getattr(target, "packed", None) else None
    if lib is None or head.dtype != torch.float32 or not pack_linears(head, lib):
        return False
    head.embed_tokens = PackedEmbedding(target.packed["embed"])
    return True


def pack_linears(module: nn.Module, lib) -> bool:
    """Every nn.Linear under `module` replaced by a PackedLinear (biases kept); nothing replaced,
    and False, when any of their widths is not whole blocks."""
    from specdec.models.packed import PackedLinear, packs

    linears = {name: m for name, m in module.named_modules() if isinstance(m, nn.Linear)}
    if not all(packs(m.weight) for m in linears.values()):
        return False
    for name, linear in linears.items():
        parent_name, _, child = name.rpartition(".")
        setattr(module.get_submodule(parent_name) if parent_name else module, child,
                PackedLinear(linear.weight, lib, linear.bias))
    return True


def read_head_tensors(path: Path) -> dict:
    """A head directory's tensors in the published layout, named without the "model." prefix some
    exporters add; t2d is left out (d2t carries the same map)."""
    tensors = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        tensors.update({name.removeprefix("model."): t for name, t in load_file(file).items()})
    tensors.pop("t2d", None)
    return tensors


def load_eagle3(path, target=None, dtype=torch.float32) -> Eagle3Head:
    """An EAGLE-3 head directory; the target's embedding is used when the head has none. With a
    packed target the head's products run packed too (pack_for_cpu)."""
    path = Path(path)
    raw = json.loads((path / "config.json").read_text())
    config = Eagle3Config.from_dict(raw)
    tensors = read_head_tensors(path)
    # A packed target's embedding stays in 8-bit blocks, which the head reads too (pack_for_cpu):
    # dequantizing it to floats first would cost the whole vocabulary's rows in memory and time.
    shared = target is not None and bool(getattr(target, "packed", None)) and "embed_tokens.weight" not in tensors
    if "embed_tokens.weight" not in tensors and not shared:
        if target is None:
            raise ConfigError(f"{path}: the head has no embed_tokens; load it with its target")
        tensors["embed_tokens.weight"] = target_weight(target, "model.embed_tokens.weight")
    if "d2t" not in tensors:
        tensors["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
    head = Eagle3Head(config, embedding_device="meta" if shared else None)
    missing, unexpected = head.load_state_dict({k: v if k == "d2t" else v.to(dtype) for k, v in tensors.items()},
                                               strict=False)
    missing = [name for name in missing if not (shared and name == "embed_tokens.weight")]
    if missing or unexpected:
        raise ConfigError(f"{path}: EAGLE-3 tensors do not match the layout (missing {missing}, unexpected {unexpected})")
    if target is not None and config.target_hidden_size != target.config.hidden_size:
        raise ConfigError(f"{path}: the head reads hidden states of width {config.target_hidden_size}; "
                          f"the target's are {target.config.hidden_size}")
    head.path = path
    head.eval()
    if target is not None:
        head.packed = pack_for_cpu(head, target)
    if shared and not head.packed:  # its widths are not whole blocks, or no native library: floats after all
        embedding = target_weight(target, "model.embed_tokens.weight").to(dtype)
        head.embed_tokens = nn.Embedding.from_pretrained(embedding, freeze=True)
    return head
