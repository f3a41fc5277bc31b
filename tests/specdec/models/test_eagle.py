"""EAGLE-3 heads in the published layout: loading, the d2t vocabulary map, and drafting from the target's features."""

import json

import pytest
import torch
from safetensors.torch import save_file

from specdec import Segment, load_model
from specdec.models.config import ConfigError
from specdec.models.eagle import Eagle3Config, is_eagle3, load_eagle3

HIDDEN, DRAFT_VOCAB = 48, 40


def _write_head(directory, target, with_embedding=False):
    """A random head in SGLang/vLLM's layout: fc, midlayer.*, norm, lm_head, d2t, t2d."""
    vocab = target.config.vocab_size
    raw = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
           "hidden_size": HIDDEN, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12,
           "intermediate_size": 64, "vocab_size": vocab, "draft_vocab_size": DRAFT_VOCAB,
           "target_hidden_size": target.config.hidden_size, "tie_word_embeddings": False,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 0, 0]}}
    gen = torch.Generator().manual_seed(7)
    kept = torch.randperm(vocab, generator=gen)[:DRAFT_VOCAB].sort().values  # the draft vocabulary, as target ids
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[kept] = True

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * 0.3

    tensors = {"fc.weight": rand(HIDDEN, 3 * target.config.hidden_size), "norm.weight": 1 + rand(HIDDEN),
               "lm_head.weight": rand(DRAFT_VOCAB, HIDDEN), "d2t": kept - torch.arange(DRAFT_VOCAB), "t2d": t2d}
    for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        tensors[f"midlayer.{name}.weight"] = 1 + rand(HIDDEN)
    for name, rows in (("q_proj", 48), ("k_proj", 24), ("v_proj", 24)):
        tensors[f"midlayer.self_attn.{name}.weight"] = rand(rows, 2 * HIDDEN)
    tensors["midlayer.self_attn.o_proj.weight"] = rand(HIDDEN, 48)
    tensors["midlayer.mlp.gate_proj.weight"] = rand(64, HIDDEN)
    tensors["midlayer.mlp.up_proj.weight"] = rand(64, HIDDEN)
    tensors["midlayer.mlp.down_proj.weight"] = rand(HIDDEN, 64)
    if with_embedding:
        tensors["embed_tokens.weight"] = rand(vocab, HIDDEN)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(raw))
    save_file(tensors, str(directory / "model.safetensors"))
    return kept


def test_config_reads_the_published_fields(tmp_path, tiny_models):
    target = load_model(tiny_models[0])
    _write_head(tmp_path / "head", target)
    config = Eagle3Config.from_dict(json.loads((tmp_path / "head" / "config.json").read_text()))
    assert is_eagle3(tmp_path / "head") and not is_eagle3(tiny_models[1])
    assert config.draft_vocab_size == DRAFT_VOCAB and config.target_hidden_size == target.config.hidden_size
    assert config.capture_layers(target.config.num_layers) == (1, 1, 1)  # "output of layer 0" = input of layer 1
    assert Eagle3Config.from_dict({**json.loads((tmp_path / "head" / "config.json").read_text()),
                                   "eagle_config": {}}).capture_layers(32) == (2, 16, 29)


def test_d2t_maps_draft_ids_to_target_ids(tmp_path, tiny_models):
    target = load_model(tiny_models[0])
    kept = _write_head(tmp_path / "head", target)
    head = load_eagle3(tmp_path / "head", target)
    assert torch.equal(head.to_target(torch.arange(DRAFT_VOCAB)), kept)
    assert torch.equal(head.embed_tokens.weight, target.model.embed_tokens.weight)  # absent: the target's


def test_head_drafts_from_the_targets_features(tmp_path, tiny_models):
    target = load_model(tiny_models[0])
    kept = set(_write_head(tmp_path / "head", target).tolist())
    head = load_eagle3(tmp_path / "head", target)
    target.capture_layers = head.config.capture_layers(target.config.num_layers)
    ids = torch.tensor(target.tokenizer.encode("def add(a, b):\n    return a + b\n").ids)
    n = len(ids)
    features = target.run(ids, torch.arange(n), [Segment(target.new_cache(n), n)]).captured  # [T, 3H]
    assert features.shape == (len(ids), 3 * target.config.hidden_size)
    cache = head.new_cache()
    logits, hidden = head(ids[1:], features[:-1], torch.arange(1, len(ids)), cache)  # step 0 over the prompt
    drafted = [int(head.to_target(logits[-1].argmax()))]
    for step in range(3):  # later steps feed the head's own output
        logits, hidden = head(torch.tensor(drafted[-1:]), hidden[-1:], torch.tensor([len(ids) + step]), cache,
                              fused=True)
        drafted.append(int(head.to_target(logits[-1].argmax())))
    assert cache.length == len(ids) - 1 + 3 and set(drafted) <= kept


def test_advance_is_forward_without_the_lm_head(tmp_path, tiny_models):
    """Catching a head up to a prompt skips the draft vocabulary's product: the same output rows
    and the same cache as forward, and forward's logits are the LM head's over those rows."""
    target = load_model(tiny_models[0])
    _write_head(tmp_path / "head", target)
    head = load_eagle3(tmp_path / "head", target)
    n = 9
    tokens = torch.randint(0, target.config.vocab_size, (n,), generator=torch.Generator().manual_seed(3))
    features = torch.randn(n, 3 * target.config.hidden_size, generator=torch.Generator().manual_seed(4))
    full, fed = head.new_cache(), head.new_cache()
    logits, hidden = head(tokens, features, torch.arange(1, n + 1), full)
    advanced = head.advance(tokens, features, torch.arange(1, n + 1), fed)
    assert torch.allclose(advanced, hidden, atol=1e-6) and fed.length == full.length == n
    assert torch.allclose(fed.keys[0][:, :, :n], full.keys[0][:, :, :n], atol=1e-6)
    assert torch.allclose(head.lm_head(head.norm(advanced)).float(), logits, atol=1e-5)
    assert logits.shape == (n, DRAFT_VOCAB)


def test_a_head_without_embedding_needs_its_target(tmp_path, tiny_models):
    target = load_model(tiny_models[0])
    _write_head(tmp_path / "head", target)
    with pytest.raises(ConfigError, match="embed_tokens"):
        load_eagle3(tmp_path / "head")
    _write_head(tmp_path / "own", target, with_embedding=True)
    assert load_eagle3(tmp_path / "own").embed_tokens.weight.shape[1] == HIDDEN


def test_every_strategy_equals_ar_with_an_eagle3_head(tmp_path, tiny_models):
    """Lossless with the head drafting: alone, batched, and reusing the prompt cache."""
    from specdec import STRATEGIES, Engine
    from tests.helpers import code_prompts, generation

    target = load_model(tiny_models[0])
    _write_head(tmp_path / "head", target)
    engine = Engine.from_pretrained(tiny_models[0], tmp_path / "head", adaptive=False)
    assert engine.head is not None and engine.draft is None
    prompts = code_prompts(6, seed=19, before=400, after=100)
    reference = [engine.complete(p, s, strategy="ar", max_tokens=10, mode="multi").tokens for _, p, s in prompts]
    for strategy in STRATEGIES:
        got = [engine.complete(p, s, strategy=strategy, max_tokens=10, mode="multi").tokens for _, p, s in prompts]
        assert got == reference, strategy
    gens = [generation(engine, p, s, strategy="hybrid", max_tokens=10, mode="multi") for _, p, s in prompts]
    with torch.inference_mode():
        engine.scheduler.run_until_done(gens)
    assert [g.result().tokens for g in gens] == reference
    for g in gens:  # the head's features are the target's, row for row, as a full forward gives them
        rows = len(g.eagle.features)
        assert rows == len(g.committed) - 1
        target.capture_layers = engine.target.capture_layers
        full = target.run(torch.tensor(g.committed[:rows]), torch.arange(rows), [Segment(target.new_cache(rows), rows)])
        assert torch.allclose(g.eagle.features, full.captured, atol=1e-4)
    drafted = engine.complete(prompts[0][1], prompts[0][2], strategy="draft", max_tokens=10, mode="multi")
    assert drafted.stats.tree_nodes > drafted.stats.target_passes  # the head proposed tokens


def test_a_head_on_a_packed_target_drafts_on_packed_blocks_as_its_float_self(packed_target_and_head):
    file, head_dir = packed_target_and_head
    packed_target, float_target = load_model(file, packed=True), load_model(file)
    packed, floats = load_eagle3(head_dir, packed_target), load_eagle3(head_dir, float_target)
    assert packed.packed and not floats.packed
    assert not any(p.numel() > 10_000 for p in packed.parameters())  # no float copy of the target's embedding
    width = 3 * float_target.config.hidden_size
    features, tokens = torch.randn(12, width, generator=torch.Generator().manual_seed(0)), torch.arange(3, 15)
    got, hidden = packed(tokens, features, torch.arange(1, 13), packed.new_cache())
    expected, expected_hidden = floats(tokens, features, torch.arange(1, 13), floats.new_cache())
    # Weights and activations both rounded to 8 bits, through six products in a row: a few percent.
    assert (got - expected).abs().mean() <= 4e-2 * expected.abs().mean()
    assert (got - expected).abs().max() <= 8e-2 * expected.abs().max()
    assert (hidden - expected_hidden).abs().max() <= 8e-2 * expected_hidden.abs().max()
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9


def test_a_head_on_a_packed_target_never_dequantizes_its_embedding(packed_target_and_head, monkeypatch):
    """The head reads the packed target's embedding in its blocks: the float rows are never read
    from the file, unless the head cannot run packed (then it falls back to floats)."""
    from specdec.models import eagle

    file, head_dir = packed_target_and_head
    target, reads = load_model(file, packed=True), []
    real = eagle.target_weight
    monkeypatch.setattr(eagle, "target_weight", lambda *args: reads.append(args[1]) or real(*args))
    assert load_eagle3(head_dir, target).packed and reads == []
    monkeypatch.setattr(eagle, "pack_for_cpu", lambda head, target: False)
    fallback = load_eagle3(head_dir, target)
    assert not fallback.packed and reads == ["model.embed_tokens.weight"]
    assert fallback.embed_tokens.weight.shape == (target.config.vocab_size, target.config.hidden_size)


def test_every_strategy_equals_ar_with_a_packed_head_on_a_packed_target(packed_target_and_head):
    from specdec import STRATEGIES, Engine

    file, head_dir = packed_target_and_head
    engine = Engine.from_pretrained(file, head_dir, quantize="auto", adaptive=False)
    assert engine.target.packed and engine.head.packed
    prompts = [([5, 77, 260, 3], [299, 41]), ([8, 150, 12, 200, 7], []), ([100, 101, 102, 103, 104, 105], [9])]
    texts = [(engine.tokenizer.decode(p), engine.tokenizer.decode(s)) for p, s in prompts]
    reference = [engine.complete(p, s, strategy="ar", max_tokens=12, mode="multi").tokens for p, s in texts]
    for strategy in STRATEGIES:
        got = [engine.complete(p, s, strategy=strategy, max_tokens=12, mode="multi").tokens for p, s in texts]
        assert got == reference, strategy
    drafted = engine.complete(*texts[0], strategy="draft", max_tokens=12, mode="multi")
    assert drafted.stats.tree_nodes > drafted.stats.target_passes  # the packed head proposed tokens


def test_a_pulled_targets_exported_head_drafts_by_default_and_only_for_its_own_file(
        packed_target_and_head, pulled_tiny):
    """A head exported into the models cache as head-NAME drafts for the pulled model NAME when its
    card names that file's SHA-256; a card for another file, or --draft none, leaves no draft."""
    import shutil
    import subprocess
    import sys

    from specdec import Engine
    from specdec.models import model_cache

    file, head_dir = packed_target_and_head
    home, pulled, digest = pulled_tiny
    head = shutil.copytree(head_dir, home / "head-tiny")
    assert model_cache.installed_head(pulled) is None  # no card: not known to fit
    (head / "card.json").write_text(json.dumps({"target_fingerprint": "0" * 64}))
    assert model_cache.installed_head(pulled) is None  # trained on another file
    (head / "card.json").write_text(json.dumps({"target_fingerprint": digest}))
    assert model_cache.installed_head(pulled) == head and model_cache.installed_head(file) is None

    engine = Engine.from_pretrained(pulled, quantize="auto", warm_up=False)
    assert engine.head is not None and engine.runtime()["draft"] == "eagle3 head"
    plain = Engine.from_pretrained(pulled, "none", quantize="auto", warm_up=False)
    assert plain.head is None and plain.draft is None and plain.runtime()["draft"] is None
    listed = subprocess.run([sys.executable, "-m", "specdec.cli", "models", "list"], capture_output=True, text=True,
                            timeout=120)
    assert listed.returncode == 0 and f"its EAGLE-3 head (drafts by default)\t{head}" in listed.stdout


def test_a_head_trained_on_this_machine_comes_before_the_one_shipped_in_the_package(
        packed_target_and_head, pulled_tiny, tmp_path, monkeypatch):
    """The package's head-NAME drafts for a fresh machine's pull; a head exported into the models
    cache replaces it; a shipped head whose card names another file is passed over."""
    import shutil

    from specdec.models import model_cache

    _, head_dir = packed_target_and_head
    home, pulled, digest = pulled_tiny
    shipped = tmp_path / "package"
    monkeypatch.setattr(model_cache, "SHIPPED_HEADS", shipped)
    packaged = shutil.copytree(head_dir, shipped / "head-tiny")
    (packaged / "card.json").write_text(json.dumps({"target_fingerprint": "0" * 64}))
    assert model_cache.installed_head(pulled) is None
    (packaged / "card.json").write_text(json.dumps({"target_fingerprint": digest}))
    assert model_cache.installed_head(pulled) == packaged
    trained_here = shutil.copytree(packaged, home / "head-tiny")
    assert model_cache.installed_head(pulled) == trained_here
    (trained_here / "card.json").write_text(json.dumps({"target_fingerprint": "1" * 64}))
    assert model_cache.installed_head(pulled) == packaged
