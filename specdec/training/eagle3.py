"""Training an EAGLE-3 head on the target's own features, and writing it in the published layout.

Two steps are trained together (training-time test, as EAGLE-3 does), so that the head also
drafts well from its own outputs:
- step 0 at pair q = (features[q], token q + 1), position q + 1, predicts the target's
  distribution for token q + 2; attention over the step-0 pairs <= q;
- step 1 at q = (the head's own step-0 output at q, token q + 2), position q + 2, predicts the
  target's distribution for token q + 3; attention over the step-0 pairs <= q and itself.
The loss is KL(target || head) plus cross-entropy on the target's argmax, at both steps.
"""

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch.utils.checkpoint import checkpoint

from specdec.models.eagle import ARCHITECTURE, Eagle3Config, Eagle3Head, read_head_tensors, target_weight
from specdec.models.ops import apply_rope, rope_cos_sin
from specdec.training.recipe import train_forward

DRAFT_VOCAB = 2048  # the most frequent target tokens: most argmaxes, at a quarter of the LM head's cost


def head_config(target_config, aux_layer_ids=None, draft_vocab: int = DRAFT_VOCAB) -> dict:
    """An EAGLE-3 config for a target: its width, one dense layer, a draft vocabulary of the
    `draft_vocab` most frequent tokens (set by draft_vocabulary())."""
    layers = target_config.num_layers
    ids = aux_layer_ids or sorted({max(0, layers // 4 - 1), layers // 2 - 1, layers - 2})
    return {"architectures": [ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": target_config.hidden_size, "target_hidden_size": target_config.hidden_size,
            "num_attention_heads": target_config.num_heads, "num_key_value_heads": target_config.num_kv_heads,
            "head_dim": target_config.head_dim, "intermediate_size": 3 * target_config.hidden_size,
            "vocab_size": target_config.vocab_size, "draft_vocab_size": min(draft_vocab, target_config.vocab_size),
            "rms_norm_eps": target_config.rms_norm_eps, "rope_theta": target_config.rope_theta,
            "tie_word_embeddings": False, "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids)[:3]
                                                             + [ids[-1]] * (3 - len(ids))}}


def build_head(raw: dict, target, seed: int = 0) -> Eagle3Head:
    head = Eagle3Head(Eagle3Config.from_dict(raw))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif name != "embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        head.embed_tokens.weight.copy_(target_weight(target, "model.embed_tokens.weight"))
    head.embed_tokens.weight.requires_grad_(False)  # the target's, as at inference
    return head


def draft_vocabulary(head: Eagle3Head, batches) -> None:
    """d2t from token counts of sample rows: the draft vocabulary is the most frequent target
    tokens, in the target's id order."""
    head.d2t.copy_(frequent_tokens_d2t(batches, head.config.vocab_size, head.config.draft_vocab_size))


def frequent_tokens_d2t(batches, vocab_size: int, draft_vocab_size: int) -> torch.Tensor:
    """d2t of a draft vocabulary of the `draft_vocab_size` tokens most frequent in `batches` (rows
    of target ids), kept in the target's id order."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for rows in batches:
        counts += torch.bincount(torch.as_tensor(rows).flatten(), minlength=counts.numel())
    kept = counts.argsort(descending=True, stable=True)[:draft_vocab_size].sort().values
    return kept - torch.arange(len(kept))


def head_loss(head: Eagle3Head, target, ids: torch.Tensor):
    """ids [B, T + 1] -> (loss, (step-0, step-1) agreement with the target's argmax), the target
    run on the batch (a small target; a real one's features come from a FeatureStore)."""
    capture = head.config.capture_layers(target.config.num_layers)
    with torch.no_grad():
        logits, _, features = train_forward(target, ids[:, :-1], capture=capture)  # [B, T, V], [B, T, 3H]
    kept, draft_of = _draft_vocabulary_maps(head, ids.device)
    losses, agree = [], []
    for h, want in zip(_two_steps(head, features, ids), (logits[:, 1:-1], logits[:, 2:]), strict=True):
        out = head.lm_head(head.norm(h)).float().flatten(0, 1)  # over the draft vocabulary
        teacher = want.float().flatten(0, 1)
        best = teacher.argmax(-1)
        soft = F.kl_div(F.log_softmax(out, -1), F.log_softmax(teacher[:, kept], -1), log_target=True,
                        reduction="batchmean")
        losses.append(soft + F.cross_entropy(out, draft_of[best], ignore_index=-100))
        agree.append((kept[out.argmax(-1)] == best).float().mean())
    return losses[0] + losses[1], tuple(agree)


class TeacherLogits:
    """A target's logits over a draft's vocabulary (an EAGLE-3 head's or a dense draft's: its
    kept() target ids) from the target's last layer's output: its final norm, then its LM head's
    rows of those tokens (a stored feature row keeps no logits)."""

    def __init__(self, target, draft):
        kept = draft.kept()
        self.norm, self.scaling = target.model.norm, target.config.logits_scaling
        self.rows = target_weight(target, "lm_head.weight")[kept].contiguous()

    def __call__(self, final: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.norm(final) @ self.rows.T / self.scaling


LOSS_CHUNK = 128  # tokens whose draft-vocabulary logits exist at once (see stored_head_loss)


def stored_head_loss(head: Eagle3Head, teacher: TeacherLogits, batch):
    """As head_loss, from a FeatureBatch: the target's features and its last layer's outputs,
    whose logits over the draft vocabulary are the teacher (its argmax over those tokens is the
    hard target, and the agreement reported is with it).

    The logits are made LOSS_CHUNK tokens at a time and made again in the backward pass
    (checkpointed): for 2,048 tokens and a 32k vocabulary, whole they are tensors of 268 MB,
    which the allocator maps and unmaps at every step, and the page faults cost most of a step."""
    wants = (batch.final[:, 1:-1], batch.final[:, 2:])
    steps = [chunked_distillation(head.logits, teacher, h, want)
             for h, want in zip(_two_steps(head, batch.features, batch.ids), wants, strict=True)]
    return steps[0][0] + steps[1][0], (steps[0][1], steps[1][1])


def chunked_distillation(logits_of, teacher: TeacherLogits, h, want):
    """(mean KL to the teacher plus cross-entropy on its argmax, share of agreeing tokens) of a
    draft's outputs h [..., H] against the target's last-layer outputs want [..., H_t];
    logits_of(h) gives the draft-vocabulary logits, LOSS_CHUNK tokens at a time (see
    stored_head_loss)."""
    h, want = h.flatten(0, -2), want.flatten(0, -2)
    total, hits = h.new_zeros(()), 0
    for start in range(0, len(h), LOSS_CHUNK):
        part = slice(start, start + LOSS_CHUNK)
        loss, agreed = checkpoint(_distilled, logits_of, teacher, h[part], want[part], use_reentrant=False)
        total, hits = total + loss, hits + agreed
    return total / len(h), hits / len(h)


def _distilled(logits_of, teacher: TeacherLogits, h, want):
    """(summed KL to the teacher plus cross-entropy on its argmax, agreeing tokens) of some tokens."""
    out = logits_of(h).float()
    target_logits = teacher(want)
    best = target_logits.argmax(-1)
    soft = F.kl_div(F.log_softmax(out, -1), F.log_softmax(target_logits, -1), log_target=True, reduction="sum")
    return soft + F.cross_entropy(out, best, reduction="sum"), (out.argmax(-1) == best).sum().float()


AGREEMENT_CHUNK = 256  # tokens whose full-vocabulary teacher logits exist at once


class TargetArgmax:
    """The target's argmax over its whole vocabulary from its last layer's outputs [N, H] (final
    norm and the full LM head, AGREEMENT_CHUNK rows at a time); the LM head is read once."""

    def __init__(self, target):
        self.norm, self.scaling = target.model.norm, target.config.logits_scaling
        self.lm_head = target_weight(target, "lm_head.weight")

    @torch.no_grad()
    def __call__(self, final: torch.Tensor) -> torch.Tensor:
        return torch.cat([(self.norm(final[a : a + AGREEMENT_CHUNK]) @ self.lm_head.T / self.scaling).argmax(-1)
                          for a in range(0, len(final), AGREEMENT_CHUNK)])


@torch.no_grad()
def store_agreement(head: Eagle3Head, target, store, rows: int) -> dict:
    """How often the head's first and second drafted tokens are the target's own next tokens,
    over `rows` rows of a feature store (held-out code): the target's argmax over its whole
    vocabulary (its final norm and full LM head on the stored last-layer outputs), so a token
    outside the draft vocabulary counts as a miss. Also the share of those argmaxes the draft
    vocabulary holds, the ceiling of any head of that vocabulary."""
    argmax = TargetArgmax(target)
    in_vocab = torch.zeros(head.config.vocab_size, dtype=torch.bool)
    in_vocab[head.to_target(torch.arange(head.config.draft_vocab_size))] = True
    hits, covered, total = [0, 0], 0, 0
    for i in range(min(rows, store.rows)):
        batch = store.batch_of([i])
        outputs = _two_steps(head, batch.features, batch.ids)
        for step, (h, final) in enumerate(zip(outputs, (batch.final[:, 1:-1], batch.final[:, 2:]), strict=True)):
            drafted = head.to_target(head.lm_head(head.norm(h)).argmax(-1)).flatten()
            final = final.flatten(0, 1)
            best = argmax(final)
            hits[step] += int((drafted == best).sum())
            if step == 0:
                covered, total = covered + int(in_vocab[best].sum()), total + len(best)
    return {"tokens": total, "step0": hits[0] / max(1, total), "step1": hits[1] / max(1, total),
            "argmax_in_draft_vocabulary": covered / max(1, total)}


def _draft_vocabulary_maps(head: Eagle3Head, device):
    """(target ids of the draft vocabulary, each target id's draft id or -100)."""
    kept = head.to_target(torch.arange(head.config.draft_vocab_size, device=device))
    draft_of = torch.full((head.config.vocab_size,), -100, dtype=torch.long, device=device)
    draft_of[kept] = torch.arange(len(kept), device=device)
    return kept, draft_of


def _two_steps(head: Eagle3Head, features, ids):
    """The head's outputs at both trained steps: step 0 from the target's features, step 1 from
    step 0's own outputs (features [B, T, 3H] of tokens 0 .. T-1, ids [B, T + 1])."""
    g0, tokens1 = features[:, :-2], ids[:, 1:-2]  # pairs q = 0 .. T-3
    length = g0.shape[1]
    h0, k0, v0 = _step(head, head.fc(g0), tokens1, torch.arange(1, length + 1), None)
    h1, _, _ = _step(head, h0, ids[:, 2:-1], torch.arange(2, length + 2), (k0, v0))
    return h0, h1


def _step(head: Eagle3Head, g, next_tokens, positions, step0_kv):
    """One head step over whole sequences: g [B, T, H] fused features -> (output, keys, values)."""
    c, layer = head.config, head.midlayer
    batch, length, _ = g.shape
    normed = layer.hidden_norm(g)
    x = torch.cat([layer.input_layernorm(head.embed_tokens(next_tokens)), normed], dim=-1)
    attn = layer.self_attn
    cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta, x.dtype)
    q = apply_rope(attn.q_proj(x).view(batch, length, c.num_heads, c.head_dim), cos, sin).transpose(1, 2)
    k = apply_rope(attn.k_proj(x).view(batch, length, c.num_kv_heads, c.head_dim), cos, sin).transpose(1, 2)
    v = attn.v_proj(x).view(batch, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
    if step0_kv is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:  # step 1: the step-0 pairs up to q, and itself
        earlier = torch.ones(length, length, dtype=torch.bool).tril()
        mask = torch.cat([earlier, torch.eye(length, dtype=torch.bool)], dim=1)
        out = F.scaled_dot_product_attention(q, torch.cat([step0_kv[0], k], 2), torch.cat([step0_kv[1], v], 2),
                                             attn_mask=mask, enable_gqa=True)
    residual = normed if c.norm_before_residual else g
    h = residual + attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1))
    return h + layer.mlp(layer.post_attention_layernorm(h)), k, v


def save_head(head: Eagle3Head, raw: dict, out: Path) -> None:
    """The published layout: config.json and model.safetensors with fc, midlayer.*, norm, lm_head,
    d2t and t2d (no embed_tokens: the target's is used), weights in bf16."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()
               if k not in ("embed_tokens.weight", "d2t")}
    tensors["d2t"] = head.d2t.clone()
    t2d = torch.zeros(head.config.vocab_size, dtype=torch.bool)
    t2d[head.to_target(torch.arange(head.config.draft_vocab_size))] = True
    tensors["t2d"] = t2d
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({**raw, "torch_dtype": "bfloat16"}, indent=2) + "\n")


def load_head_weights(head: Eagle3Head, path: Path) -> None:
    """A head's weights and draft vocabulary from `path` (the published layout, as save_head
    writes it); the embedding stays the target's. Read from the files, not through load_eagle3:
    for a packed target that packs the head's matrices, and their floats would not train.
    ValueError when the files are not a head of this one's shape."""
    tensors = read_head_tensors(path)
    tensors.pop("embed_tokens.weight", None)
    own = head.state_dict()
    wanted = [name for name in own if name != "embed_tokens.weight"]
    wrong = [name for name in wanted if name not in tensors or tensors[name].shape != own[name].shape]
    if not tensors or wrong:
        raise ValueError(f"{path}: not a head of this shape (missing or other shapes: {wrong[:4]})")
    head.load_state_dict({name: tensors[name].to(own[name].dtype) for name in wanted}, strict=False)


HEAD_LOGGED = "agreement"  # the name train() logs head_loss_fn's second value under


def head_loss_fn(target, device: str = "cpu", stored: TeacherLogits | None = None):
    """The train() loss for a head: (loss, step-0 agreement) on a batch of rows, the target run
    on each; or, with `stored`, on a FeatureBatch."""
    def loss(head, batch):
        if stored is not None:
            total, agree = stored_head_loss(head, stored, batch)
        else:
            total, agree = head_loss(head, target, torch.as_tensor(batch, device=device))
        return total, agree[0]
    return loss
