"""GGUF files as checkpoints: tiny random models written by `gguf`'s writer in llama.cpp's layout,
compared with the same weights in transformers and loaded from safetensors."""

import subprocess
import sys

import pytest
import torch

from specdec import load_model
from specdec.models.config import ConfigError
from specdec.models.loader import CheckpointError
from tests.specdec.models.gguf_files import FIM, write_gguf

SHAPE = dict(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, max_position_embeddings=256)
IDS = torch.tensor([[5, 77, 260, 3, 299, 41, 8, 150, 12, 200]])


def tiny_transformers_model(arch: str):
    import transformers as tf

    torch.manual_seed(0)
    if arch == "llama":  # q/k rows permuted by llama.cpp's converter
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**SHAPE, rope_theta=5000.0))
    elif arch == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**SHAPE, rope_theta=1e6))
    elif arch == "qwen3":  # a head_dim other than hidden / heads, tied embeddings
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**SHAPE, head_dim=24, tie_word_embeddings=True))
    elif arch == "qwen2moe":  # every layer MoE, a shared expert with its sigmoid gate
        model = tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(**SHAPE, num_experts=6, num_experts_per_tok=2,
                                                         moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                                         decoder_sparse_step=1, mlp_only_layers=[]))
    else:
        model = tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(**SHAPE, head_dim=16, num_experts=6, num_experts_per_tok=2,
                                                         moe_intermediate_size=32, norm_topk_prob=True,
                                                         decoder_sparse_step=1, mlp_only_layers=[]))
    with torch.no_grad():  # norms away from 1 and biases away from 0, so that a dropped one shows
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                parameter.add_(0.2 * torch.randn_like(parameter))
    return model.eval()


@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory):
    """{arch: (gguf file, safetensors directory, transformers model)}."""
    out = {}
    for arch in ("llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe"):
        model = tiny_transformers_model(arch)
        folder = tmp_path_factory.mktemp(arch)
        model.save_pretrained(folder / "hf")
        out[arch] = (write_gguf(folder / f"{arch}.gguf", model), folder / "hf", model)
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe"])
def test_a_gguf_file_gives_the_logits_of_the_same_weights_in_transformers_and_safetensors(gguf_models, arch):
    file, folder, reference = gguf_models[arch]
    model = load_model(file)
    with torch.no_grad():
        expected = reference(IDS).logits
        got = model.logits(IDS)
        from_safetensors = load_model(folder).logits(IDS)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=2e-5, rtol=1e-4), (got - expected).abs().max()
    assert torch.allclose(got, from_safetensors, atol=2e-5, rtol=1e-4)


def test_quantized_tensors_are_dequantized_as_llama_cpp_stores_them(gguf_models, tmp_path):
    import gguf

    _, _, reference = gguf_models["qwen2"]
    file = write_gguf(tmp_path / "q8.gguf", reference, quantization=gguf.GGMLQuantizationType.Q8_0)
    rounded = tiny_transformers_model("qwen2")  # the same weights, through Q8_0 and back
    with torch.no_grad():
        for parameter in rounded.parameters():
            if parameter.ndim == 2:
                q = gguf.quants.quantize(parameter.numpy(), gguf.GGMLQuantizationType.Q8_0)
                parameter.copy_(torch.from_numpy(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)))
        expected = rounded(IDS).logits
        unrounded = reference(IDS).logits
        got = load_model(file).logits(IDS)
    assert torch.allclose(got, expected, atol=2e-5, rtol=1e-4)
    assert not torch.allclose(got, unrounded, atol=2e-5, rtol=1e-4)  # the rounding did reach the weights


def test_the_config_and_tokenizer_come_from_the_metadata(gguf_models):
    model = load_model(gguf_models["qwen3"][0])
    cfg = model.config
    assert (cfg.architecture, cfg.num_layers, cfg.head_dim, cfg.num_kv_heads) == ("Qwen3ForCausalLM", 2, 24, 2)
    assert cfg.tie_word_embeddings and cfg.eos_token_ids == (299,)
    tokenizer = model.tokenizer
    fim = [tokenizer.token_to_id(t) for t in FIM]
    assert fim == [296, 297, 298, 299]
    ids = tokenizer.encode("<|fim_prefix|>ab cd<|fim_suffix|>é\n").ids
    assert ids[0] == fim[0] and fim[1] in ids
    assert tokenizer.token_to_id("ab") in ids  # a merge the file lists
    assert tokenizer.decode(tokenizer.encode("def f(x):\n    return é  # ok\n").ids) == "def f(x):\n    return é  # ok\n"


def test_experts_of_a_shard_are_read_alone(gguf_models):
    file = gguf_models["qwen3moe"][0]
    full = load_model(file)
    shard = load_model(file, experts={0: [4, 1], 1: [0, 5]})
    for layer, wanted in ((0, [4, 1]), (1, [0, 5])):
        full_experts = full.model.layers[layer].mlp.experts
        shard_experts = shard.model.layers[layer].mlp.experts
        assert torch.equal(shard_experts.down_proj, full_experts.down_proj[wanted])
        assert torch.equal(shard_experts.gate_up_proj, full_experts.gate_up_proj[wanted])


def test_memory_is_estimated_from_the_header_before_any_weight_is_read(gguf_models, monkeypatch):
    from specdec.models import loader

    file = gguf_models["qwen2"][0]
    monkeypatch.setattr(loader, "available_bytes", lambda device: 1000)
    monkeypatch.setattr(loader.GgufCheckpoint, "iter_tensors", lambda *a: pytest.fail("weights were read"))
    with pytest.raises(CheckpointError, match="GiB"):
        load_model(file)


def test_bad_gguf_files_give_clear_errors(gguf_models, tmp_path):
    good = gguf_models["qwen2"][0].read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good[: len(good) // 3])
    with pytest.raises((ConfigError, CheckpointError), match="truncated.gguf"):
        load_model(truncated)
    other = tmp_path / "other.gguf"
    other.write_bytes(good.replace(b"qwen2", b"gpt2x", 1))  # general.architecture's value
    with pytest.raises(ConfigError, match="'gpt2x' is not supported"):
        load_model(other)
    done = subprocess.run([sys.executable, "-m", "specdec.cli", "complete", str(truncated), "--line", "1", "--col",
                           "0", "--target", str(truncated)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 2 and "specdec: error:" in done.stderr and "Traceback" not in done.stderr


def test_the_header_reader_agrees_with_ggufs_own_reader(gguf_models, tmp_path):
    import gguf
    import numpy as np

    from specdec.models.gguf_header import GgufHeader

    for arch in ("llama", "qwen2moe"):
        file = gguf_models[arch][0]
        theirs, ours = gguf.GGUFReader(file), GgufHeader(file)
        fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
        assert ours.metadata == fields
        assert list(ours.tensors) == [t.name for t in theirs.tensors]
        for tensor in theirs.tensors:
            info = ours.tensors[tensor.name]
            assert (info.shape, info.type) == (tuple(tensor.shape.tolist()), int(tensor.tensor_type))
            assert np.array_equal(ours.raw_data(info).view(tensor.data.dtype).reshape(tensor.data.shape), tensor.data)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="not a GGUF file"):
        GgufHeader(empty)
