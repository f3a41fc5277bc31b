"""Model configurations of the embedded defaults and the differentiable training forward."""

import torch
import torch.nn.functional as F

from specdec.models.config import ModelConfig
from specdec.models.model import SparseMoeBlock, Transformer
from specdec.models.ops import apply_rope, rope_cos_sin

VOCAB_SIZE = 8192
CONTEXT = 2048


def _common(vocab_size: int, special_ids: dict) -> dict:
    return {
        "vocab_size": vocab_size,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": CONTEXT,
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "eos_token_id": special_ids["<|endoftext|>"],
        "pad_token_id": special_ids["<|endoftext|>"],
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "torch_dtype": "bfloat16",
        "fim_mode": "spm",  # read by specdec.prompt.fim: which order the model was trained to prefer
    }


# Target shapes compared at equal wall-clock before the long run (held-out loss per CPU-hour).
TARGET_SHAPES = {
    "wide": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
             "moe_intermediate_size": 256},
    "deep": {"hidden_size": 192, "num_hidden_layers": 6, "num_attention_heads": 6, "num_key_value_heads": 2,
             "moe_intermediate_size": 256},
}
DEFAULT_SHAPE = "wide"


def target_config(vocab_size: int, special_ids: dict, shape: str = DEFAULT_SHAPE) -> dict:
    """Qwen3-MoE, 8 experts top-2, in one of TARGET_SHAPES."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        **_common(vocab_size, special_ids),
        "head_dim": 32,
        "intermediate_size": 1024,  # only used by mlp_only_layers, of which there are none
        "num_experts": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "router_aux_loss_coef": 0.01,
        "output_router_logits": False,
        **TARGET_SHAPES[shape],
    }


def draft_config(vocab_size: int, special_ids: dict) -> dict:
    """Dense Qwen3, two layers: a CPU step costs per layer more than per multiply-add."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **_common(vocab_size, special_ids),
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "intermediate_size": 384,
    }


def active_params(cfg: ModelConfig) -> int:
    """Weights multiplied per token (the embedding lookup excluded, the LM head included)."""
    attn = cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    dense = 3 * cfg.hidden_size * cfg.intermediate_size
    sparse = 3 * cfg.hidden_size * cfg.moe_intermediate_size * cfg.top_k + cfg.hidden_size * cfg.num_experts
    mlp = sum(sparse if i in cfg.sparse_layers else dense for i in range(cfg.num_layers))
    return cfg.num_layers * attn + mlp + cfg.hidden_size * cfg.vocab_size


def init_weights(model: Transformer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "norm" in name:
            torch.nn.init.ones_(p)
        elif name.endswith("bias"):
            torch.nn.init.zeros_(p)
        else:
            std = 0.02 / (2 * model.config.num_layers) ** 0.5 if name.endswith(("o_proj.weight", "down_proj")) else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def train_forward(model: Transformer, ids, capture=()):
    """ids [B, T] -> (logits [B, T, V], load-balancing loss); causal, differentiable. With
    `capture` (layer indices), also the inputs of those layers, concatenated: [B, T, k*H]."""
    x, aux, inputs = train_hidden(model, ids, capture)
    logits = model.lm_head(model.model.norm(x))
    if capture:
        return logits, aux, torch.cat([inputs[i] for i in capture], dim=-1)
    return logits, aux


def train_hidden(model: Transformer, ids, capture=()):
    """ids [B, T] -> (the last layer's outputs [B, T, H] before the final norm, load-balancing
    loss, {layer: its input} for the `capture` layers); causal, differentiable."""
    cfg = model.config
    batch, length = ids.shape
    x = model.model.embed_tokens(ids)
    cos, sin = rope_cos_sin(torch.arange(length, device=ids.device), cfg.head_dim, cfg.rope_theta, x.dtype)
    aux = x.new_zeros(())
    inputs = {}
    for i, layer in enumerate(model.model.layers):
        if i in capture:
            inputs[i] = x
        x = x + _attention(layer.self_attn, layer.input_layernorm(x), cos, sin)
        h = layer.post_attention_layernorm(x)
        if isinstance(layer.mlp, SparseMoeBlock):
            y, layer_aux = _moe(layer.mlp, h.reshape(batch * length, -1))
            x, aux = x + y.view_as(x), aux + layer_aux
        else:
            x = x + layer.mlp(h)
    return x, aux, inputs


def _attention(attn, h, cos, sin):
    cfg = attn.cfg
    batch, length, _ = h.shape
    q = attn.q_proj(h).view(batch, length, cfg.num_heads, cfg.head_dim)
    k = attn.k_proj(h).view(batch, length, cfg.num_kv_heads, cfg.head_dim)
    v = attn.v_proj(h).view(batch, length, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    )
    return attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


def _moe(block: SparseMoeBlock, h):
    """Routed experts plus the Switch-Transformer balance loss E * sum_e(fraction_e * mean_prob_e)."""
    from specdec_kernels.moe_torch import fused_moe_torch

    probs = torch.softmax(block.gate(h), dim=-1, dtype=torch.float32)  # [N, E]
    weights, ids = torch.topk(probs, block.top_k, dim=-1)
    if block.renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    num_experts = probs.shape[-1]
    fraction = torch.bincount(ids.reshape(-1), minlength=num_experts).float() / ids.numel()
    aux = num_experts * (fraction * probs.mean(0)).sum()
    return fused_moe_torch(h, block.experts.gate_up_proj, block.experts.down_proj, weights, ids), aux
