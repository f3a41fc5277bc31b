"""Our transformer against transformers' own on tiny random checkpoints of every supported architecture."""

import json

import pytest
import torch

from specdec import Segment, load_model
from tests.conftest import ARCHS


def _rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(hf_checkpoints, arch):
    directory, reference = hf_checkpoints[arch]
    model = load_model(directory)
    ids = torch.randint(0, 97, (2, 19), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(ids).logits
    assert _rel_err(model.logits(ids), expected) < 1e-4


@pytest.mark.parametrize("arch", ["gpt_oss", "deepseek_v2", "mistral", "starcoder2"])
def test_long_sequences_match_transformers(hf_checkpoints, arch):
    """160 positions: past YaRN's original context (64) and far past GPT-OSS's window (5)."""
    directory, reference = hf_checkpoints[arch]
    ids = torch.randint(0, 97, (1, 160), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        expected = reference(ids).logits
    assert _rel_err(load_model(directory).logits(ids), expected) < 1e-4


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "qwen2", "qwen2_moe", "gpt_oss", "deepseek_v2",
                                  "deepseek_v2_qlora", "mistral", "granitemoe", "starcoder2"])
def test_cached_decoding_matches_causal_forward(hf_checkpoints, arch):
    model = load_model(hf_checkpoints[arch][0])
    ids = torch.randint(0, 97, (1, 16), generator=torch.Generator().manual_seed(2))
    full = model.logits(ids)[0]
    cache = model.new_cache(capacity=4)  # small, so that growing is exercised
    pieces = []
    for start, end in [(0, 7), (7, 8), (8, 12), (12, 13), (13, 16)]:
        chunk = ids[0, start:end]
        pieces.append(model(chunk, torch.arange(start, end), [Segment(cache, end - start)]))
        cache.keep_all()
    assert _rel_err(torch.cat(pieces), full) < 1e-4


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss", "deepseek_v2"])
def test_tree_forward_matches_each_path(hf_checkpoints, arch):
    """A tree with two branches after a prefix gives each node the logits of its own path
    (GPT-OSS: the prefix is longer than its sliding window, and every softmax has a sink)."""
    model = load_model(hf_checkpoints[arch][0])
    gen = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 97, (6,), generator=gen)
    # nodes: 0 root; 1 child of 0; 2 child of 1; 3 child of 0 (second branch); 4 child of 3
    tokens = torch.randint(0, 97, (5,), generator=gen)
    parents = [-1, 0, 1, 0, 3]
    depth = [0, 1, 2, 1, 2]
    mask = torch.zeros(5, 5, dtype=torch.bool)
    for i in range(5):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    cache = model.new_cache()
    model(prefix, torch.arange(6), [Segment(cache, 6)])
    cache.keep_all()
    tree_logits = model(tokens, 6 + torch.tensor(depth), [Segment(cache, 5, mask)])
    for leaf, path in [(2, [0, 1, 2]), (4, [0, 3, 4])]:
        seq = torch.cat([prefix, tokens[path]])[None]
        causal = model.logits(seq)[0, 6:]
        assert _rel_err(tree_logits[path], causal) < 1e-4, leaf
    # Keeping the second branch leaves a cache equal to prefilling that path.
    cache.keep([0, 3, 4])
    nxt = torch.tensor([5])
    after = model(nxt, torch.tensor([9]), [Segment(cache, 1)])
    seq = torch.cat([prefix, tokens[[0, 3, 4]], nxt])[None]
    assert _rel_err(after[0], model.logits(seq)[0, -1]) < 1e-4


def test_batched_segments_match_alone(hf_checkpoints):
    model = load_model(hf_checkpoints["mixtral"][0])
    gen = torch.Generator().manual_seed(4)
    a, b = torch.randint(0, 97, (9,), generator=gen), torch.randint(0, 97, (4,), generator=gen)
    ca, cb = model.new_cache(), model.new_cache()
    both = model(torch.cat([a, b]), torch.cat([torch.arange(9), torch.arange(4)]), [Segment(ca, 9), Segment(cb, 4)])
    assert _rel_err(both[:9], model.logits(a[None])[0]) < 1e-4
    assert _rel_err(both[9:], model.logits(b[None])[0]) < 1e-4


def test_dtype_conversion(hf_checkpoints):
    directory, _ = hf_checkpoints["qwen3_moe"]
    model = load_model(directory, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    ids = torch.randint(0, 97, (1, 8))
    ref = load_model(directory).logits(ids)
    assert _rel_err(model.logits(ids), ref) < 5e-2


def test_expert_load_counts_tokens(hf_checkpoints):
    model = load_model(hf_checkpoints["qwen3_moe"][0])
    model.reset_expert_load()
    model.logits(torch.randint(0, 97, (1, 10)))
    load = model.expert_load()
    assert load.shape == (2, 6)  # layers 0 and 2 are sparse, 1 is in mlp_only_layers
    assert load.sum(dim=1).tolist() == [20, 20]  # 10 tokens x top-2


def test_qwen2_moe_layout_is_read(hf_checkpoints):
    step2 = load_model(hf_checkpoints["qwen2_moe_step2"][0]).config
    assert step2.sparse_layers == (1, 3) and step2.shared_expert_size == 7 and step2.norm_topk_prob
    assert not step2.attention_bias
    listed = load_model(hf_checkpoints["qwen2_moe"][0]).config
    assert listed.sparse_layers == (0, 1, 3) and listed.attention_bias and not listed.o_proj_bias


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen2_moe_step2", "gpt_oss", "deepseek_v2", "mistral", "granitemoe",
                                  "starcoder2"])
def test_every_strategy_equals_ar_on_the_family(arch, tiny_models, tmp_path):
    """The engine path on the family: cached decode and tree verification give ar's tokens."""
    import shutil

    import transformers as tf

    from specdec import STRATEGIES, Engine
    from tests.conftest import tiny_hf_model
    from tests.helpers import code_prompts

    tokenizer_file = tiny_models[0] / "tokenizer.json"
    vocab = json.loads(tokenizer_file.read_text())["model"]["vocab"]
    hf = tiny_hf_model(arch)
    config = hf.config
    config.vocab_size = len(vocab) + 7  # added special tokens
    model = type(hf)(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.35)
    model.save_pretrained(tmp_path)
    shutil.copy(tokenizer_file, tmp_path / "tokenizer.json")
    expected = {"gpt_oss": tf.GptOssForCausalLM, "deepseek_v2": tf.DeepseekV2ForCausalLM,
                "mistral": tf.MistralForCausalLM, "granitemoe": tf.GraniteMoeForCausalLM,
                "starcoder2": tf.Starcoder2ForCausalLM}.get(arch, tf.Qwen2MoeForCausalLM)
    assert isinstance(model, expected)
    target = load_model(tmp_path)
    engine = Engine(target, target, adaptive=False)  # the target as its own draft: deep trees accepted
    for _path, prefix, suffix in code_prompts(4, seed=17, before=300, after=80):
        reference = engine.complete(prefix, suffix, strategy="ar", max_tokens=10, mode="multi").tokens
        for strategy in STRATEGIES:
            assert engine.complete(prefix, suffix, strategy=strategy, max_tokens=10, mode="multi").tokens == reference


def _gpt_oss_experts_as_mxfp4(directory, out):
    """The checkpoint in `directory` with its experts stored as GPT-OSS ships them: MXFP4 blocks
    [E, out, in/32, 16] and scales [E, out, in/32] (biases as they are)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from specdec_kernels import dequantize_mxfp4, quantize_mxfp4

    shutil.copytree(directory, out)
    tensors, dequantized = load_file(str(out / "model.safetensors")), {}
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        weight = tensors.pop(name).transpose(1, 2).float()  # [E, out, in]
        packed, scales = quantize_mxfp4(weight)
        tensors[f"{name}_blocks"] = packed.view(*packed.shape[:2], -1, 16)
        tensors[f"{name}_scales"] = scales
        dequantized[name] = dequantize_mxfp4(packed, scales).transpose(1, 2).contiguous()
    save_file(tensors, str(out / "model.safetensors"))
    return dequantized


def test_gpt_oss_mxfp4_experts_load_as_decoded(hf_checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    directory = hf_checkpoints["gpt_oss"][0]
    dequantized = _gpt_oss_experts_as_mxfp4(directory, tmp_path / "mxfp4")
    plain = tmp_path / "decoded"
    plain.mkdir()
    (plain / "config.json").write_text((directory / "config.json").read_text())
    tensors = {**load_file(str(directory / "model.safetensors")), **dequantized}
    save_file(tensors, str(plain / "model.safetensors"))
    ids = torch.randint(0, 97, (1, 17), generator=torch.Generator().manual_seed(4))
    assert torch.allclose(load_model(tmp_path / "mxfp4").logits(ids), load_model(plain).logits(ids), atol=1e-5)


def test_gpt_oss_bf16_checkpoint_loads(hf_checkpoints, tmp_path):
    directory, reference = hf_checkpoints["gpt_oss"]
    reference.to(torch.bfloat16).save_pretrained(tmp_path)
    reference.to(torch.float32)
    config = load_model(tmp_path).config
    assert config.layer_windows == (5, 0, 5) and config.attention_sinks and config.routing == "topk_softmax"
    ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(5))
    assert _rel_err(load_model(tmp_path).logits(ids), load_model(directory).logits(ids)) < 0.05


def test_deepseek_cache_holds_the_latent(hf_checkpoints):
    model = load_model(hf_checkpoints["deepseek_v2"][0])
    cache = model.new_cache(8)
    c = model.config
    assert cache.keys.shape[2:] == (1, 8, c.kv_lora_rank + c.head_dim) and cache.values.shape[-1] == 0


def test_gpt_oss_mxfp4_file_matches_transformers_own_dequantised_load(hf_checkpoints, tmp_path):
    import transformers as tf

    _gpt_oss_experts_as_mxfp4(hf_checkpoints["gpt_oss"][0], tmp_path / "mxfp4")
    config = json.loads((tmp_path / "mxfp4" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (tmp_path / "mxfp4" / "config.json").write_text(json.dumps(config))
    reference = tf.GptOssForCausalLM.from_pretrained(tmp_path / "mxfp4", dtype=torch.float32,
                                                     quantization_config=tf.Mxfp4Config(dequantize=True)).eval()
    ids = torch.randint(0, 97, (1, 17), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = reference(ids).logits
    assert _rel_err(load_model(tmp_path / "mxfp4").logits(ids), expected) < 1e-4


def _as_fp8_blocks(weight, block):
    """weight [out, in] -> (e4m3 weight, weight_scale_inv [ceil(out/bo), ceil(in/bi)]) as DeepSeek
    ships them, and the weight they decode to (padded blocks, reshaped: written apart from the loader's)."""
    rows, cols = weight.shape
    br, bc = -(-rows // block[0]), -(-cols // block[1])
    padded = torch.zeros(br * block[0], bc * block[1])
    padded[:rows, :cols] = weight
    blocks = padded.view(br, block[0], bc, block[1])
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-8) / 448.0
    fp8 = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    decoded = (fp8.float() * scale[:, None, :, None]).view(br * block[0], bc * block[1])[:rows, :cols].contiguous()
    return fp8.view(br * block[0], bc * block[1])[:rows, :cols].contiguous(), scale, decoded


def test_fp8_block_scaled_weights_load_as_decoded(hf_checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    directory = hf_checkpoints["deepseek_v2"][0]
    block = (16, 20)  # rows and columns that do not divide evenly
    tensors, decoded = load_file(str(directory / "model.safetensors")), {}
    for name in [n for n in tensors if n.endswith("proj.weight") and tensors[n].dim() == 2]:
        fp8, scale, decoded[name] = _as_fp8_blocks(tensors[name].float(), block)
        tensors[name], tensors[name[: -len("weight")] + "weight_scale_inv"] = fp8, scale
    assert len(decoded) > 6
    for out, stored in (("fp8", tensors), ("decoded", {**load_file(str(directory / "model.safetensors")), **decoded})):
        (tmp_path / out).mkdir()
        config = json.loads((directory / "config.json").read_text())
        if out == "fp8":
            config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": list(block)}
        (tmp_path / out / "config.json").write_text(json.dumps(config))
        save_file(stored, str(tmp_path / out / "model.safetensors"))
    ids = torch.randint(0, 97, (1, 15), generator=torch.Generator().manual_seed(6))
    assert torch.allclose(load_model(tmp_path / "fp8").logits(ids), load_model(tmp_path / "decoded").logits(ids), atol=1e-5)
    dropped = next(k for k in tensors if k.endswith("weight_scale_inv"))
    orphan = {k: v for k, v in tensors.items() if k != dropped}
    save_file(orphan, str(tmp_path / "fp8" / "model.safetensors"))
    with pytest.raises(ValueError, match="without their block scales"):
        load_model(tmp_path / "fp8")


def test_a_forward_of_no_new_tokens_gives_no_logits_and_keeps_the_cache(hf_checkpoints):
    model = load_model(hf_checkpoints["qwen3_moe"][0])
    cache = model.new_cache()
    model(torch.arange(5), torch.arange(5), [Segment(cache, 5)])
    cache.keep_all()
    empty = torch.zeros(0, dtype=torch.long)
    out = model(empty, empty, [Segment(cache, 0)])
    assert out.shape == (0, model.config.vocab_size) and cache.length == 5
    assert _rel_err(model(torch.tensor([7]), torch.tensor([5]), [Segment(cache, 1)])[0],
                    model.logits(torch.tensor([[0, 1, 2, 3, 4, 7]]))[0, -1]) < 1e-4
