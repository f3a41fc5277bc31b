"""A small dense draft of its target's tokenizer, distilled from the target (specdec.training.dense_draft).

It is a plain decoder stack that reads the text, like any draft model, but built around its
target so that it costs a few percent of a target step:
- its input is the target's own embedding (shared, not stored: for a packed target the head reads
  the packed rows in place, as an EAGLE-3 head does);
- its layers have the target's width and layout (Qwen2: q/k/v biases), and start as copies of a
  few of the target's layers;
- its output covers a draft vocabulary (d2t, as an EAGLE-3 head's: target id = draft id +
  d2t[draft id]), so its LM head is a few thousand rows instead of the target's 152k, which for
  a 0.5B target would cost a third of a target step by itself.

Its forward has a draft model's signature and gives logits over the target's vocabulary (the
tokens outside the draft vocabulary at -inf), so DraftRunner drafts with it as with any draft
model, and the target verifies every token as usual: the output stays the target's own.

Directory: config.json (architectures ["SpecdecDenseDraft"], the body's Qwen2 fields,
vocab_size: the target's, draft_vocab_size) and model.safetensors (the body's tensors under
`model.`, `lm_head.weight` [V_d, H], `d2t` int64 [V_d]; no embedding).
"""

import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from specdec.models.config import ConfigError, ModelConfig
from specdec.models.eagle import pack_linears, target_weight
from specdec.models.kvcache import KVCache
from specdec.models.model import ForwardOut, Transformer

ARCHITECTURE = "SpecdecDenseDraft"
BODY_ARCHITECTURE = "Qwen2ForCausalLM"


def is_dense_draft(path) -> bool:
    config = Path(path) / "config.json"
    return config.exists() and ARCHITECTURE in (json.loads(config.read_text()).get("architectures") or [])


def body_config(raw: dict) -> ModelConfig:
    """The decoder stack's config: the draft's fields, its vocabulary the draft vocabulary."""
    if ARCHITECTURE not in (raw.get("architectures") or []):
        raise ConfigError(f"not a dense draft: architectures {raw.get('architectures')!r}")
    return ModelConfig.from_dict({**raw, "architectures": [BODY_ARCHITECTURE], "vocab_size": raw["draft_vocab_size"],
                                  "tie_word_embeddings": False})


class DenseDraft(nn.Module):
    """A draft model over the target's token ids: body (a Transformer over the draft vocabulary)
    with the target's embedding as its input."""

    def __init__(self, raw: dict, embedding: nn.Module):
        super().__init__()
        self.body = Transformer(body_config(raw))
        self.body.model.embed_tokens = embedding
        self.register_buffer("d2t", torch.zeros(raw["draft_vocab_size"], dtype=torch.long))
        self.raw = raw
        # What callers of a draft model read: the target's vocabulary, the body's depth and width.
        self.config = replace(self.body.config, vocab_size=raw["vocab_size"], raw=raw)
        self.tokenizer = None
        self.path = None  # the directory it was loaded from

    @property
    def dtype(self) -> torch.dtype:
        return self.body.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.body.model.norm.weight.device

    def kept(self) -> torch.Tensor:
        """The target ids of the draft vocabulary, in draft-id order."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def new_cache(self, capacity: int = 256) -> KVCache:
        # Not body.new_cache: the body's dtype is read from its embedding, which may be packed.
        return KVCache(self.config.num_layers, **self.body.cache_dims(), dtype=self.dtype, device=self.device,
                       capacity=capacity)

    def forward(self, input_ids, positions, segments, logits_rows=None) -> torch.Tensor:
        return self.run(input_ids, positions, segments, logits_rows).logits

    def run(self, input_ids, positions, segments, logits_rows=None) -> ForwardOut:
        """As Transformer.run, with logits over the target's vocabulary (-inf outside the draft's)."""
        out = self.body.run(input_ids, positions, segments, logits_rows)
        full = out.logits.new_full((out.logits.shape[0], self.config.vocab_size), float("-inf"))
        full[:, self.kept()] = out.logits
        return ForwardOut(full)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of the body's last-layer outputs (training)."""
        return self.body.lm_head(self.body.model.norm(hidden))


def load_dense_draft(path, target) -> DenseDraft:
    """A dense draft directory for `target` (whose embedding it reads); with a packed target its
    matrices run packed too."""
    path = Path(path)
    raw = json.loads((path / "config.json").read_text())
    if raw.get("vocab_size") != target.config.vocab_size or raw.get("hidden_size") != target.config.hidden_size:
        raise ConfigError(f"{path}: a dense draft of vocabulary {raw.get('vocab_size')} and width "
                          f"{raw.get('hidden_size')} cannot draft for a target of {target.config.vocab_size} "
                          f"and {target.config.hidden_size}")
    packed = bool(getattr(target, "packed", None))
    draft = DenseDraft(raw, _target_embedding(target, packed))
    tensors = {name: t.float() if t.is_floating_point() else t for name, t in load_file(path / "model.safetensors").items()}
    own = {name for name in draft.state_dict() if not name.startswith("body.model.embed_tokens")}
    wanted = {f"body.{name}" if name != "d2t" else name: t for name, t in tensors.items()}
    missing, unexpected = sorted(own - set(wanted)), sorted(set(wanted) - own)
    if missing or unexpected:
        raise ConfigError(f"{path}: dense-draft tensors do not match its config (missing {missing[:4]}, "
                          f"unexpected {unexpected[:4]})")
    draft.load_state_dict(wanted, strict=False)
    draft.eval()
    draft.path = path
    if packed:
        from specdec_kernels import cpu_decode

        lib = cpu_decode.library()
        if lib is not None:
            pack_linears(draft.body, lib)
    return draft


def _target_embedding(target, packed: bool) -> nn.Module:
    if packed:
        from specdec.models.packed import PackedEmbedding

        return PackedEmbedding(target.packed["embed"])
    weight = target_weight(target, "model.embed_tokens.weight")
    return nn.Embedding.from_pretrained(weight.float(), freeze=True)
