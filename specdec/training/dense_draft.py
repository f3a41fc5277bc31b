"""Distilling a small dense draft (specdec.models.dense_draft) from its target's stored features.

The draft starts as a few of the target's own layers (by default its first and its last), its
final norm and the draft vocabulary's rows of its LM head: before any training it is the target
with the middle layers skipped, which already agrees with it on the easy tokens. Training then
fits it to the target's next-token distributions, KL plus cross-entropy on the target's argmax
over the draft vocabulary, as the EAGLE-3 head is trained (eagle3.chunked_distillation). The
teacher's logits come from the feature store's last-layer outputs, so the target is never run
again; the draft reads only the rows' token ids.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from specdec.models.dense_draft import ARCHITECTURE, DenseDraft
from specdec.models.eagle import target_weight
from specdec.training.eagle3 import TargetArgmax, TeacherLogits, chunked_distillation
from specdec.training.recipe import train_hidden

DEFAULT_LAYERS = (0, -1)  # the target's first and last layers


def dense_draft_config(target_config, draft_vocab_size: int, init_layers=DEFAULT_LAYERS) -> dict:
    """A dense draft's config for a target: its width, heads and MLP, len(init_layers) layers."""
    c = target_config
    layers = sorted({i % c.num_layers for i in init_layers})
    return {"architectures": [ARCHITECTURE], "model_type": "qwen2", "num_hidden_layers": len(layers),
            "hidden_size": c.hidden_size, "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
            "head_dim": c.head_dim, "intermediate_size": c.intermediate_size, "vocab_size": c.vocab_size,
            "draft_vocab_size": draft_vocab_size, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
            "max_position_embeddings": c.max_position_embeddings, "init_layers": layers}


def build_dense_draft(raw: dict, target, d2t: torch.Tensor) -> DenseDraft:
    """The draft of `raw` as the target's layers raw["init_layers"], its final norm and its LM
    head's rows of the draft vocabulary (d2t); the embedding is the target's, frozen."""
    if target.config.attention_bias is False:
        raise ValueError("dense drafts are built from Qwen2-style targets (q/k/v biases)")
    embedding = nn.Embedding.from_pretrained(target_weight(target, "model.embed_tokens.weight").float(), freeze=True)
    draft = DenseDraft(raw, embedding)
    draft.d2t.copy_(d2t)
    with torch.no_grad():
        for own, source in enumerate(raw["init_layers"]):
            for name, param in draft.body.model.layers[own].named_parameters():
                param.copy_(target_weight(target, f"model.layers.{source}.{name}"))
        draft.body.model.norm.weight.copy_(target_weight(target, "model.norm.weight"))
        draft.body.lm_head.weight.copy_(target_weight(target, "lm_head.weight")[draft.kept()])
    return draft


def dense_draft_loss(draft: DenseDraft, teacher: TeacherLogits, batch):
    """(loss, agreement with the target's argmax over the draft vocabulary) on a FeatureBatch:
    the draft reads ids 0 .. T-1 and its output at t is matched with the target's at t (its
    distribution for token t + 1)."""
    hidden, _, _ = train_hidden(draft.body, batch.ids[:, :-1])
    return chunked_distillation(draft.draft_logits, teacher, hidden, batch.final)


def dense_loss_fn(teacher: TeacherLogits):
    def loss(draft, batch):
        return dense_draft_loss(draft, teacher, batch)
    return loss


@torch.no_grad()
def dense_agreement(draft: DenseDraft, target, store, rows: int) -> dict:
    """How often the draft's next token is the target's own (its argmax over the whole vocabulary),
    over `rows` rows of a (held-out) feature store, as eagle3.store_agreement gives a head's first
    step; a dense draft's second token is drafted from its own first, as its first is."""
    argmax = TargetArgmax(target)
    kept = draft.kept()
    hits = total = 0
    for i in range(min(rows, store.rows)):
        batch = store.batch_of([i])
        hidden, _, _ = train_hidden(draft.body, batch.ids[:, :-1])
        drafted = kept[draft.draft_logits(hidden).argmax(-1)].flatten()
        best = argmax(batch.final.flatten(0, 1))
        hits, total = hits + int((drafted == best).sum()), total + len(best)
    return {"tokens": total, "step0": hits / max(1, total)}


def save_dense_draft(draft: DenseDraft, out: Path) -> None:
    """The directory load_dense_draft reads: config.json and model.safetensors (bf16 weights, the
    body's under their Transformer names, d2t; no embedding)."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name.removeprefix("body."): t.detach().to(torch.bfloat16).contiguous()
               for name, t in draft.state_dict().items()
               if name.startswith("body.") and not name.startswith("body.model.embed_tokens")}
    tensors["d2t"] = draft.d2t.clone()
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({**draft.raw, "torch_dtype": "bfloat16"}, indent=2) + "\n")
