"""int8 weights (--quantize int8): close to fp32, an int8 row's output independent of its batch
(so speculation stays lossless to the quantized target), every family's layers covered, bad
requests refused with a message."""

import pytest
import torch

from specdec import Engine, Segment, load_model
from specdec.models.quantize import Int8Weight, quantize_int8, quantize_target
from tests.helpers import code_prompts


@pytest.fixture(scope="module")
def pair(tiny_models):
    target, _ = tiny_models
    return load_model(target), quantize_int8(load_model(target))


def _relative_error(got, expected) -> float:
    return float((got - expected).norm() / expected.norm())


def test_int8_logits_close_to_fp32(pair):
    fp32, int8 = pair
    ids = torch.tensor([list(range(5, 69))])
    expected, got = fp32.logits(ids), int8.logits(ids)
    # Random tiny weights are int8's worst case (the shipped target's bits per character move by
    # 0.0002: bench/int8_quality.py); a wrong scale or layout would be off by 100% or more.
    assert _relative_error(got, expected) < 0.3
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() > 0.75
    assert not torch.equal(got, expected)  # the weights really are int8


def test_an_int8_rows_output_does_not_depend_on_its_batch():
    weight = Int8Weight(torch.randn(48, 40), torch.randn(48))
    rows = torch.randn(16, 40)
    assert torch.equal(weight(rows)[3], weight(rows[3:4])[0])  # integer sums: exact, whatever the blocking


def test_a_tokens_logits_in_a_tree_match_it_decoded_alone(pair):
    _, int8 = pair
    ids = torch.arange(3, 43)
    with torch.inference_mode():
        cache = int8.new_cache(64)
        int8(ids[:24], torch.arange(24), [Segment(cache, 24)])
        cache.keep_all()
        together = int8(ids[24:40], torch.arange(24, 40), [Segment(cache, 16)])
        cache.truncate(24)
        alone = int8(ids[24:25], torch.tensor([24]), [Segment(cache, 1)])
    # fp32 attention and routers round differently with the batch's shape; int8 adds nothing
    torch.testing.assert_close(together[0], alone[0], atol=1e-5, rtol=1e-5)


def test_speculation_is_lossless_to_the_int8_target(tiny_models):
    target, draft = tiny_models
    engine = Engine.from_pretrained(target, draft, quantize="int8", adaptive=False)
    for _, prefix, suffix in code_prompts(12, seed=4):
        reference = engine.complete(prefix, suffix, strategy="ar", max_tokens=10, mode="multi").tokens
        for strategy in ("draft", "ngram", "hybrid"):
            assert engine.complete(prefix, suffix, strategy=strategy, max_tokens=10, mode="multi").tokens == reference


@pytest.mark.parametrize("arch", ["llama", "gpt_oss", "starcoder2", "qwen2_moe", "deepseek_v2"])
def test_every_family_quantizes(hf_checkpoints, arch):
    directory, _ = hf_checkpoints[arch]
    ids = torch.tensor([list(range(3, 40))])
    expected = load_model(directory).logits(ids)
    got = quantize_int8(load_model(directory)).logits(ids)
    assert _relative_error(got, expected) < 0.1


def test_refusals(tiny_models):
    target, _ = tiny_models
    with pytest.raises(ValueError, match="int4.*none, int8"):
        quantize_target(load_model(target), "int4")
    with pytest.raises(ValueError, match="float32"):
        quantize_target(load_model(target, dtype=torch.bfloat16), "int8")


def test_auto_picks_int8_for_a_float32_cpu_target_without_a_native_step_only(tiny_models):
    target, _ = tiny_models
    assert getattr(quantize_target(load_model(target), "auto"), "quantization", None) is None  # native fp32
    eager = load_model(target)
    eager.native_step = None  # as without a C compiler
    assert getattr(quantize_target(eager, "auto"), "quantization", None) == "int8"
    assert getattr(quantize_target(load_model(target, dtype=torch.bfloat16), "auto"), "quantization", None) is None
    sharded = load_model(target)
    for block in sharded.moe_blocks():  # as specdec.parallel.expert_parallel marks its shards
        block.__class__ = type("Shard", (type(block),), {})
    assert getattr(quantize_target(sharded, "auto"), "quantization", None) is None
    with pytest.raises(ValueError, match="expert-parallel"):
        quantize_int8(sharded)
