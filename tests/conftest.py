"""Shared fixtures: tiny real checkpoints written by transformers (offline, from configs)."""

import os
import sys
from pathlib import Path

# The tests import the project as installed (specdec_kernels, specdec_server, specdec_eval). The
# repository root is on the path only for `bench` and `tests`, and after site-packages: first,
# its folders kernels/, server/ and eval/ would shadow installed packages of those names
# (transformers imports Hugging Face's `kernels`). pyproject's --import-mode=importlib keeps
# pytest itself from putting the root first.
sys.path.append(str(Path(__file__).resolve().parents[1]))

# Triton kernels run in its interpreter on machines without a GPU (must be set before triton loads).
os.environ.setdefault("TRITON_INTERPRET", "1")


import atexit
import shutil
import tempfile

import pytest
import torch

from specdec.models.model_cache import installed_path, models_home

# Where scripts/setup.sh pulled the real models (tests/specdec/test_real_model.py reads them there).
# Everything else runs with an empty models cache, so that a CLI or server under test with no
# --target serves the embedded models, as the tests expect, whatever this machine has pulled.
# pytest-xdist's workers inherit the SPECDEC_HOME set below: the first process's answer travels to them.
os.environ.setdefault("SPECDEC_PULLED_HOME", str(models_home()))
PULLED_MODELS = Path(os.environ["SPECDEC_PULLED_HOME"])
DEFAULT_NAME = "qwen2.5-coder-0.5b"
PULLED_DEFAULT = installed_path(DEFAULT_NAME, PULLED_MODELS)
NOT_PULLED = f"{DEFAULT_NAME} is not pulled (specdec models pull {DEFAULT_NAME})"
needs_pulled_default = pytest.mark.skipif(PULLED_DEFAULT is None, reason=NOT_PULLED)
os.environ["SPECDEC_HOME"] = tempfile.mkdtemp(prefix="specdec-test-models-")
atexit.register(shutil.rmtree, os.environ["SPECDEC_HOME"], True)

# The test models are tiny: intra-op threads only add synchronisation (and stall badly when
# another process holds the cores).
torch.set_num_threads(1)

COMMON = dict(vocab_size=97, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=48, max_position_embeddings=256)


def tiny_hf_model(arch: str):
    """A random transformers model of the given architecture, small enough for CPU tests."""
    import transformers as tf

    torch.manual_seed(0)
    if arch == "llama":
        cfg = tf.LlamaConfig(**COMMON, attention_bias=True, tie_word_embeddings=True)
        return tf.LlamaForCausalLM(cfg)
    if arch == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**COMMON, rope_theta=5000.0))
    if arch == "qwen3":
        return tf.Qwen3ForCausalLM(tf.Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=True))
    if arch == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(**COMMON, head_dim=8, num_experts=6, num_experts_per_tok=2,
                                moe_intermediate_size=16, norm_topk_prob=True, decoder_sparse_step=1,
                                mlp_only_layers=[1])
        return tf.Qwen3MoeForCausalLM(cfg)
    if arch == "qwen2_moe":  # non-default options: dense layers by step and by list, no renormalising
        cfg = tf.Qwen2MoeConfig(**{**COMMON, "num_hidden_layers": 4}, num_experts=6, num_experts_per_tok=3,
                                moe_intermediate_size=12, shared_expert_intermediate_size=20, norm_topk_prob=False,
                                decoder_sparse_step=1, mlp_only_layers=[2])
        return tf.Qwen2MoeForCausalLM(cfg)
    if arch == "qwen2_moe_step2":  # MoE every second layer, renormalised top-k, no q/k/v bias, an odd shared width
        cfg = tf.Qwen2MoeConfig(**{**COMMON, "num_hidden_layers": 4}, num_experts=5, num_experts_per_tok=2,
                                moe_intermediate_size=20, shared_expert_intermediate_size=7, norm_topk_prob=True,
                                decoder_sparse_step=2, qkv_bias=False)
        return tf.Qwen2MoeForCausalLM(cfg)
    if arch == "gpt_oss":  # sliding windows shorter than the tests' sequences, sinks, YaRN, clamped SwiGLU
        cfg = tf.GptOssConfig(**{**COMMON, "intermediate_size": 32}, head_dim=8, num_local_experts=6,
                              num_experts_per_tok=2, sliding_window=5, swiglu_limit=1.5,
                              rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                               "truncate": False, "original_max_position_embeddings": 64,
                                               "rope_theta": 150000.0})
        cfg._attn_implementation = "eager"
        return tf.GptOssForCausalLM(cfg)
    if arch in ("deepseek_v2", "deepseek_v2_qlora"):  # MLA, group-limited routing, YaRN with mscale
        cfg = tf.DeepseekV2Config(**{**COMMON, "num_key_value_heads": 4}, kv_lora_rank=16, qk_nope_head_dim=8,
                                  qk_rope_head_dim=4, v_head_dim=6, n_routed_experts=8, n_group=4, topk_group=2,
                                  topk_method="group_limited_greedy", num_experts_per_tok=3, n_shared_experts=1,
                                  moe_intermediate_size=12, first_k_dense_replace=1, routed_scaling_factor=1.5,
                                  q_lora_rank=24 if arch == "deepseek_v2_qlora" else None,
                                  rope_parameters={"rope_type": "yarn", "factor": 4.0, "mscale": 0.707,
                                                   "mscale_all_dim": 0.707, "original_max_position_embeddings": 64,
                                                   "beta_fast": 32.0, "beta_slow": 1.0, "rope_theta": 10000.0})
        cfg._attn_implementation = "eager"
        return tf.DeepseekV2ForCausalLM(cfg)
    if arch == "mistral":  # a sliding window shorter than the tests' sequences
        return tf.MistralForCausalLM(tf.MistralConfig(**COMMON, head_dim=12, sliding_window=6))
    if arch == "granitemoe":  # every multiplier away from 1
        cfg = tf.GraniteMoeConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=3.0,
                                  residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=2.5)
        return tf.GraniteMoeForCausalLM(cfg)
    if arch == "starcoder2":  # LayerNorm with bias, GELU MLP with biases, a window shorter than the sequences
        return tf.Starcoder2ForCausalLM(tf.Starcoder2Config(**COMMON, sliding_window=7, use_bias=True))
    if arch == "mixtral":
        cfg = tf.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2)
        return tf.MixtralForCausalLM(cfg)
    raise ValueError(arch)


ARCHS = ["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "qwen2_moe", "qwen2_moe_step2", "gpt_oss", "deepseek_v2", "mistral", "granitemoe", "starcoder2",
         "deepseek_v2_qlora"]


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """{arch: (directory, transformers model)} for the five supported architectures."""
    out = {}
    for arch in ARCHS:
        model = tiny_hf_model(arch).eval()
        # Random init leaves norms at 1; perturb them so that a missing weight would show.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
                elif name.endswith(("sinks", "bias")):  # GPT-OSS's sinks and biases start at or near 0
                    p.copy_(0.5 * torch.randn_like(p))
        directory = tmp_path_factory.mktemp(arch)
        model.save_pretrained(directory)
        out[arch] = (directory, model)
    return out


@pytest.fixture(scope="session")
def pulled_engine():
    """The pulled default model packed, as it serves, in one engine for the whole session: its
    load and its warm-up (the verify cost measured over real passes) take half a minute."""
    from specdec import Engine, load_model

    if PULLED_DEFAULT is None:
        pytest.skip(NOT_PULLED)
    engine = Engine(load_model(PULLED_DEFAULT, packed=True), None, None, warm_up=False)
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """(target dir, draft dir): tiny random Qwen3-MoE target and Qwen3 draft with a real BPE tokenizer."""
    from tests.helpers import make_tiny_models

    return make_tiny_models(tmp_path_factory.mktemp("tiny_models"))
