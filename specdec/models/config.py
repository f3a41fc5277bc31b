"""ModelConfig: the parts of a Hugging Face config.json that the one transformer implementation needs."""

import json
from dataclasses import dataclass, field
from pathlib import Path

DENSE_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
                       "Starcoder2ForCausalLM")
MOE_ARCHITECTURES = ("Qwen3MoeForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM", "GptOssForCausalLM",
                     "DeepseekV2ForCausalLM", "GraniteMoeForCausalLM")
GPT_OSS, DEEPSEEK_V2 = "GptOssForCausalLM", "DeepseekV2ForCausalLM"
_QWEN2_STYLE = ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM")  # q/k/v bias, no o_proj bias
SUPPORTED_ARCHITECTURES = DENSE_ARCHITECTURES + MOE_ARCHITECTURES


class ConfigError(ValueError):
    """A config.json this project cannot run, with the reason in the message."""


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int  # < num_heads means grouped-query attention
    head_dim: int
    intermediate_size: int  # dense MLP width (drafts, and Qwen3-MoE's mlp_only_layers)
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # Qwen2 always has q/k/v bias; Llama when attention_bias is set
    qk_norm: bool  # Qwen3's per-head RMSNorm on queries and keys
    o_proj_bias: bool = False  # Llama's attention_bias covers o_proj too; Qwen2's bias does not
    mlp_bias: bool = False  # Llama's mlp_bias
    num_experts: int = 0  # 0: every layer dense
    top_k: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # Mixtral always renormalises the top-k weights
    sparse_layers: tuple = ()  # indices of the layers whose MLP is an MoE block
    shared_expert_size: int = 0  # Qwen2-MoE: an always-on expert of this width, gated by a sigmoid
    eos_token_ids: tuple = ()
    # GPT-OSS: router bias, top-k on the logits then a softmax over those k, expert biases, the
    # clamped SwiGLU ((up + 1) * gate * sigmoid(alpha * gate)), attention sinks, sliding windows
    routing: str = "softmax_topk"  # or "topk_softmax"
    router_bias: bool = False
    expert_bias: bool = False
    swiglu_limit: float | None = None  # set: the clamped SwiGLU
    swiglu_alpha: float = 1.702
    attention_sinks: bool = False
    layer_windows: tuple = ()  # per layer: a sliding window in tokens, 0 for full attention
    norm_in_fp32: bool = False  # RMSNorm's weight multiplied before the cast back (GPT-OSS)
    rope_scaling: dict | None = None  # YaRN parameters, or None for plain RoPE
    # DeepSeek-V2: multi-head latent attention (the KV cache holds the compressed latent and the
    # rope key), group-limited routing scaled by routed_scaling_factor, ungated shared experts
    kv_lora_rank: int = 0  # > 0: MLA
    q_lora_rank: int | None = None
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    expert_groups: tuple = ()  # (n_group, topk_group) for group-limited greedy routing
    routed_scaling_factor: float = 1.0
    shared_expert_gated: bool = True  # Qwen2-MoE's sigmoid gate; DeepSeek adds its shared experts as they are
    # Granite-MoE's multipliers: of the embeddings, of each block's output into the residual,
    # the attention scale (instead of 1/sqrt(head_dim)), and a divisor of the logits
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_scale: float | None = None
    logits_scaling: float = 1.0
    # StarCoder2: LayerNorm with bias, and a GELU MLP (c_fc, c_proj) with biases
    layer_norm: bool = False
    gelu_mlp: str | None = None  # the activation: "gelu_pytorch_tanh" or "gelu"
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def is_moe(self) -> bool:
        return bool(self.sparse_layers)

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        architecture = _architecture(raw)
        hidden, heads = raw["hidden_size"], raw["num_attention_heads"]
        num_layers = raw["num_hidden_layers"]
        num_experts = raw.get("num_experts", raw.get("num_local_experts", raw.get("n_routed_experts", 0))) or 0
        if architecture not in MOE_ARCHITECTURES:
            num_experts = 0
        is_mixtral = architecture == "MixtralForCausalLM"
        is_gpt_oss = architecture == GPT_OSS
        family = _FAMILY_FIELDS.get(architecture)
        extra = family(raw, num_layers) if family else {}
        fields = dict(
            architecture=architecture,
            vocab_size=raw["vocab_size"],
            hidden_size=hidden,
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or hidden // heads,
            intermediate_size=raw.get("intermediate_size", 0),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-5 if is_gpt_oss else 1e-6),
            rope_theta=_rope_theta(raw, 150000.0 if is_gpt_oss else 10000.0),
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=_attention_bias(raw, architecture),
            qk_norm=architecture in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
            o_proj_bias=architecture not in _QWEN2_STYLE and _attention_bias(raw, architecture),
            mlp_bias=bool(raw.get("mlp_bias")),
            num_experts=num_experts,
            top_k=raw.get("num_experts_per_tok", 0) if num_experts else 0,
            # Mixtral's experts use intermediate_size; Qwen3-MoE has a separate width.
            moe_intermediate_size=(
                raw.get("intermediate_size", 0) if is_mixtral or is_gpt_oss or architecture == "GraniteMoeForCausalLM"
                else raw.get("moe_intermediate_size", 0)
            ),
            norm_topk_prob=True if is_mixtral else bool(raw.get("norm_topk_prob", False)),
            sparse_layers=_sparse_layers(raw, architecture, num_layers, num_experts),
            shared_expert_size=raw.get("shared_expert_intermediate_size", 0) if architecture == "Qwen2MoeForCausalLM" else 0,
            eos_token_ids=_as_tuple(raw.get("eos_token_id")),
            rope_scaling=_yarn(raw, default=is_gpt_oss),
            raw=raw,
        )
        return cls(**{**fields, **extra})

    @classmethod
    def from_file(cls, path) -> "ModelConfig":
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path}: no config.json; expected a Hugging Face model directory") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"{path}: not valid JSON ({err})") from None
        try:
            return cls.from_dict(raw)
        except KeyError as err:
            raise ConfigError(f"{path}: missing required field {err.args[0]!r}") from None


def _architecture(raw: dict) -> str:
    names = raw.get("architectures") or []
    for name in names:
        if name in SUPPORTED_ARCHITECTURES:
            return name
    raise ConfigError(
        f"unsupported architecture {names or raw.get('model_type')!r}; "
        f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _gpt_oss_fields(raw: dict, num_layers: int) -> dict:
    window = raw.get("sliding_window") or 0
    types = raw.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
    if len(types) != num_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise ConfigError(f"layer_types {types!r}: expected {num_layers} of sliding_attention / full_attention")
    return {"routing": "topk_softmax", "router_bias": True, "expert_bias": True, "attention_sinks": True,
            "swiglu_limit": float(raw.get("swiglu_limit", 7.0)), "swiglu_alpha": float(raw.get("swiglu_alpha", 1.702)),
            "layer_windows": tuple(window if t == "sliding_attention" else 0 for t in types), "norm_in_fp32": True}


def _starcoder2_fields(raw: dict, num_layers: int) -> dict:
    act = raw.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu"):
        raise ConfigError(f"hidden_act {act!r}: StarCoder2 models with gelu_pytorch_tanh or gelu are supported")
    bias = bool(raw.get("use_bias", True))
    window = raw.get("sliding_window") or 0
    return {"layer_norm": True, "gelu_mlp": act, "attention_bias": bias, "o_proj_bias": bias, "mlp_bias": bias,
            "rms_norm_eps": float(raw.get("norm_epsilon", 1e-5)),
            "layer_windows": (int(window),) * num_layers if window else ()}


def _deepseek_fields(raw: dict, num_layers: int) -> dict:
    method = raw.get("topk_method") or "greedy"
    if method not in ("greedy", "group_limited_greedy"):
        raise ConfigError(f"topk_method {method!r}: only greedy and group_limited_greedy are supported")
    groups = ()
    if method == "group_limited_greedy":
        groups = (int(raw["n_group"]), int(raw["topk_group"]))
        if raw["n_routed_experts"] % groups[0]:
            raise ConfigError(f"n_group {groups[0]} does not divide n_routed_experts {raw['n_routed_experts']}")
    moe_width = raw.get("moe_intermediate_size", 0)
    return {"head_dim": raw["qk_rope_head_dim"], "kv_lora_rank": raw["kv_lora_rank"], "q_lora_rank": raw.get("q_lora_rank"),
            "qk_nope_head_dim": raw["qk_nope_head_dim"], "v_head_dim": raw["v_head_dim"], "expert_groups": groups,
            "routed_scaling_factor": float(raw.get("routed_scaling_factor", 1.0)),
            "shared_expert_size": moe_width * (raw.get("n_shared_experts") or 0), "shared_expert_gated": False,
            "sparse_layers": tuple(range(raw.get("first_k_dense_replace") or 0, num_layers)),
            "norm_topk_prob": bool(raw.get("norm_topk_prob", False))}


def _granite_fields(raw: dict, num_layers: int) -> dict:
    return {"routing": "topk_softmax", "embedding_multiplier": float(raw.get("embedding_multiplier", 1.0)),
            "residual_multiplier": float(raw.get("residual_multiplier", 1.0)),
            "attention_scale": float(raw.get("attention_multiplier", 1.0)),
            "logits_scaling": float(raw.get("logits_scaling", 1.0))}


def _mistral_fields(raw: dict, num_layers: int) -> dict:
    """Mistral, Codestral: one sliding window on every layer, when set."""
    window = raw.get("sliding_window")
    return {"layer_windows": (int(window),) * num_layers} if window else {}


# What each family sets beyond the common fields, from its raw config and layer count.
_FAMILY_FIELDS = {GPT_OSS: _gpt_oss_fields, DEEPSEEK_V2: _deepseek_fields, "GraniteMoeForCausalLM": _granite_fields,
                  "Starcoder2ForCausalLM": _starcoder2_fields, "MistralForCausalLM": _mistral_fields}


def _yarn(raw: dict, default: bool = False) -> dict | None:
    params = raw.get("rope_parameters") or raw.get("rope_scaling")
    if params is None and default:  # GPT-OSS's own default
        params = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                  "original_max_position_embeddings": 4096}
    if not params or params.get("rope_type", params.get("type")) != "yarn":
        return None
    if "original_max_position_embeddings" not in params:
        raise ConfigError("rope_parameters: YaRN needs original_max_position_embeddings")
    return dict(params)


def _attention_bias(raw: dict, architecture: str) -> bool:
    if architecture == GPT_OSS:
        return bool(raw.get("attention_bias", True))
    if architecture == "Qwen2ForCausalLM":
        return True
    if architecture == "Qwen2MoeForCausalLM":
        if raw.get("use_sliding_window"):
            raise ConfigError("use_sliding_window: sliding-window attention is not supported for Qwen2-MoE yet")
        return bool(raw.get("qkv_bias", True))
    return bool(raw.get("attention_bias"))


def _rope_theta(raw: dict, default: float = 10000.0) -> float:
    """rope_theta from transformers v4's top-level field or v5's rope_parameters."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "yarn", None):
        raise ConfigError(f"rope_type {rope_type!r} is not supported; only 'default' and 'yarn' RoPE are")
    return float(params.get("rope_theta", raw.get("rope_theta", default)))


def _sparse_layers(raw, architecture, num_layers, num_experts) -> tuple:
    if not num_experts:
        return ()
    if architecture in ("MixtralForCausalLM", "GraniteMoeForCausalLM"):
        return tuple(range(num_layers))
    step = raw.get("decoder_sparse_step", 1) or 1
    dense = set(raw.get("mlp_only_layers") or [])
    return tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)


def _as_tuple(value) -> tuple:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)
