"""GGUF model files (llama.cpp's format, what Ollama and LM Studio run) read as checkpoints.

The header is read by gguf_header.py and the file stays mapped; the config is built from its
metadata, the tokenizer from its vocabulary (gguf_tokenizer.py), and each tensor is renamed to the
Hugging Face name the loader expects and dequantized to floats by the `gguf` package (llama.cpp's
own) as it is read. Nothing is read before it is needed: the header alone gives the config and
the memory estimate.

llama.cpp's converter stores a few tensors in another layout than transformers:
- Llama's q/k projections are permuted for its interleaved rotary embedding (undone here);
- an MoE layer's experts are stacked per projection (`ffn_gate_exps` [E, I, H]); the gate and
  up stacks are joined into the fused gate_up [E, 2I, H] the kernels read;
- Qwen2-MoE's shared-expert gate is a vector ([H], here [1, H]).
"""

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from specdec.models.config import ConfigError
from specdec.models.gguf_header import GgufFormatError, GgufHeader

# GGUF architecture -> (transformers architecture, model_type)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe"),
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight", "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight", "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
}
_EXPERT_STACKS = ("ffn_gate_exps.weight", "ffn_up_exps.weight")  # joined into mlp.experts.gate_up_proj
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


def is_gguf(path: Path) -> bool:
    """A file that starts with GGUF's magic bytes."""
    try:
        with open(path, "rb") as handle:
            return path.is_file() and handle.read(4) == b"GGUF"
    except OSError:
        return False


class GgufCheckpoint:
    """One .gguf file: its metadata, its config as a transformers config dict, its tensors."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.header = GgufHeader(self.path)
        except (OSError, GgufFormatError) as err:
            raise ConfigError(f"{self.path}: cannot read GGUF file ({err})") from None
        self.tensors = self.header.tensors
        self.arch = self.value("general.architecture")
        if self.arch not in ARCHITECTURES:
            raise ConfigError(f"{self.path}: GGUF architecture {self.arch!r} is not supported; "
                              f"supported: {', '.join(sorted(ARCHITECTURES))}")

    def value(self, key: str, default=None):
        return self.header.metadata.get(key, default)

    def arch_value(self, key: str, default=None):
        return self.value(f"{self.arch}.{key}", default)

    def raw_config(self) -> dict:
        """The model's config in transformers' config.json terms, from the metadata."""
        architecture, model_type = ARCHITECTURES[self.arch]
        heads = self._required("attention.head_count")
        hidden = self._required("embedding_length")
        embedding = self.tensors.get("token_embd.weight")
        if embedding is None:
            raise ConfigError(f"{self.path}: no token_embd.weight tensor")
        raw = {
            "architectures": [architecture], "model_type": model_type,
            "vocab_size": int(embedding.shape[1]), "hidden_size": hidden,
            "num_hidden_layers": self._required("block_count"), "num_attention_heads": heads,
            "num_key_value_heads": self.arch_value("attention.head_count_kv", heads),
            "head_dim": self.arch_value("attention.key_length", hidden // heads),
            "intermediate_size": self.arch_value("feed_forward_length", 0),
            "rms_norm_eps": self.arch_value("attention.layer_norm_rms_epsilon", 1e-6),
            "rope_theta": self.arch_value("rope.freq_base", 10000.0),
            "max_position_embeddings": self.arch_value("context_length", 4096),
            "tie_word_embeddings": "output.weight" not in self.tensors,
            "eos_token_id": self._end_of_generation_ids(),
            "attention_bias": "blk.0.attn_q.bias" in self.tensors,
        }
        if self.arch.endswith("moe"):
            raw.update(self._moe_fields())
        scaling = self.arch_value("rope.scaling.type", "none")
        if scaling not in ("none", None):
            raise ConfigError(f"{self.path}: rope scaling {scaling!r} in a GGUF file is not supported")
        return raw

    def _moe_fields(self) -> dict:
        fields = {"num_experts": self._required("expert_count"),
                  "num_experts_per_tok": self._required("expert_used_count"),
                  "moe_intermediate_size": self._required("expert_feed_forward_length"),
                  "decoder_sparse_step": 1, "mlp_only_layers": [],
                  # llama.cpp's defaults for the two families when the file does not say
                  "norm_topk_prob": bool(self.arch_value("expert_weights_norm", self.arch == "qwen3moe"))}
        if self.arch == "qwen2moe":
            fields["shared_expert_intermediate_size"] = self.arch_value("expert_shared_feed_forward_length", 0)
        return fields

    def _required(self, key: str):
        value = self.arch_value(key)
        if value is None:
            raise ConfigError(f"{self.path}: GGUF metadata lacks {self.arch}.{key}")
        return value

    def _end_of_generation_ids(self) -> list:
        ids = [self.value(f"tokenizer.ggml.{name}_token_id") for name in ("eos", "eot", "eom")]
        return sorted({int(i) for i in ids if i is not None})

    def weight_bytes(self, dtype, keep_rows=lambda name: None) -> int:
        """The weights' size once dequantized to `dtype`, from the header's shapes alone."""
        element = torch.tensor([], dtype=dtype).element_size()
        total = 0
        for name, tensor in self.tensors.items():
            count = int(np.prod(tensor.shape))
            rows = keep_rows(self.hf_name(name) or "")
            if rows is not None and len(tensor.shape) == 3:
                count = count * len(rows) // max(1, int(tensor.shape[2]))
            total += count * element
        return total

    def hf_name(self, name: str) -> str | None:
        if name in _GLOBAL_NAMES:
            return _GLOBAL_NAMES[name]
        match = _BLOCK.match(name)
        if match is None:
            return None
        layer, part = match.groups()
        if part in _EXPERT_STACKS:
            return f"model.layers.{layer}.mlp.experts.gate_up_proj"
        mapped = _BLOCK_NAMES.get(part)
        return f"model.layers.{layer}.{mapped}" if mapped else None

    def iter_tensors(self, rows_of=lambda name: None) -> Iterator[tuple[str, torch.Tensor]]:
        """(Hugging Face name, float32 tensor) of every tensor; rows_of(name) may pick expert rows
        ([] skips the tensor). Unknown tensor names come through as they are, for the loader to name."""
        stacks = {}
        for name, tensor in self.tensors.items():
            hf = self.hf_name(name)
            rows = rows_of(hf) if hf else None
            if rows is not None and not rows:
                continue
            values = self._dequantized(tensor, rows)
            part = _block_part(name)
            if part in _EXPERT_STACKS:  # gate and up: joined once both are read
                halves = stacks.setdefault(hf, {})
                halves[part] = values
                if len(halves) == 2:
                    del stacks[hf]
                    yield hf, torch.cat([halves[_EXPERT_STACKS[0]], halves[_EXPERT_STACKS[1]]], dim=1)
                continue
            yield (hf or name), self._relaid(part, values)
        for hf, halves in stacks.items():  # a gate without its up (or the reverse): the loader names it
            yield hf, next(iter(halves.values()))

    def float_tensor(self, hf_name: str) -> torch.Tensor:
        """One tensor (not an expert stack) by its Hugging Face name, as float32."""
        for name, tensor in self.tensors.items():
            part = _block_part(name)
            if self.hf_name(name) == hf_name and part not in _EXPERT_STACKS:
                return self._relaid(part, self._dequantized(tensor, None))
        raise ConfigError(f"{self.path}: no tensor {hf_name}")

    def iter_packed(self) -> Iterator[tuple[str, object]]:
        """As iter_tensors, but the matrices the native step multiplies in integers (projections,
        lm_head, embedding) come as PackedRows made from their own blocks, never as floats."""
        from gguf import GGMLQuantizationType

        from specdec.models.packed import BLOCK, from_gguf

        for name, tensor in self.tensors.items():
            hf, part = self.hf_name(name), _block_part(name)
            if not (hf and _is_packable(hf, tensor.shape) and part not in _EXPERT_STACKS):
                yield (hf or name), self._relaid(part, self._dequantized(tensor, None))
                continue
            try:
                kind = GGMLQuantizationType(tensor.type).name
            except ValueError:
                raise ConfigError(f"{self.path}: tensor {tensor.name} has unknown type {tensor.type}") from None
            raw = self.header.raw_data(tensor)
            rows = from_gguf(raw, kind, lambda t=tensor: self._dequantized(t, None).numpy())
            if self.arch == "llama" and part.startswith(("attn_q.", "attn_k.")):
                order = self._relaid(part, torch.arange(rows.shape[0])[:, None])[:, 0].numpy()
                rows = rows.take_rows(order)
            assert rows.shape[1] % BLOCK == 0
            yield hf, rows

    def _dequantized(self, tensor, rows) -> torch.Tensor:
        from gguf import GGMLQuantizationType, quants

        try:
            kind = GGMLQuantizationType(tensor.type)
            data = self.header.raw_data(tensor)
            if rows is not None:
                data = data[list(rows)]
            values = quants.dequantize(data, kind)
        except (ValueError, KeyError, NotImplementedError) as err:
            raise ConfigError(f"{self.path}: tensor {tensor.name} (type {tensor.type}) cannot be read: {err}") from None
        values = np.ascontiguousarray(values, dtype=np.float32)
        if not values.flags.writeable:  # a float32 tensor is a view of the mapped file: copied, not aliased
            values = values.copy()
        return torch.from_numpy(values)

    def _relaid(self, part: str, values: torch.Tensor) -> torch.Tensor:
        if self.arch == "llama" and part.startswith(("attn_q.", "attn_k.")):
            heads = self._required("attention.head_count")
            if part.startswith("attn_k."):
                heads = self.arch_value("attention.head_count_kv", heads)
            return _unpermute_rotary(values, heads)
        if part == "ffn_gate_inp_shexp.weight":
            return values.reshape(1, -1)
        return values


def _is_packable(hf_name: str, shape: tuple) -> bool:
    """A 2-D projection, lm_head or embedding whose rows split into blocks of 32."""
    wanted = hf_name.endswith("_proj.weight") or hf_name in ("lm_head.weight", "model.embed_tokens.weight")
    return wanted and len(shape) == 2 and shape[0] % 32 == 0


def _block_part(name: str) -> str:
    """`attn_q.weight` of `blk.3.attn_q.weight`; "" for a tensor outside the blocks."""
    match = _BLOCK.match(name)
    return match.group(2) if match else ""


def _unpermute_rotary(values: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's converter permutation of Llama q/k rows (rotary pairs interleaved per head)."""
    rows = values.shape[0]
    rest = values.shape[1:]
    return values.reshape(heads, rows // heads // 2, 2, *rest).transpose(1, 2).reshape(rows, *rest).contiguous()
