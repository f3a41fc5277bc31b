"""The native CPU decode step (specdec/models/native.py, kernels/cpu_decode.c): the same logits, cache
rows, expert statistics and captured hidden states as the eager step on every family it
covers; the families it does not cover, and models rewritten after loading, decode eagerly."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec import Engine, Segment, default_model_dir, load_model
from specdec.models import native
from specdec.models.quantize import quantize_int8
from tests.helpers import code_prompts

COVERED = ["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral"]
NOT_COVERED = {"gpt_oss": "sinks", "deepseek_v2": "latent", "mistral": "window", "granitemoe": "scaled",
               "starcoder2": "LayerNorm", "qwen2_moe": "shared expert"}


def _rel_err(a, b):
    return float((a - b).norm() / b.norm())


def _decode_one_by_one(model, ids, prompt: int = 5, outs=None):
    """A prefill of `prompt` tokens, then the rest one token a step, in a cache that must grow;
    each step's ForwardOut goes into `outs` when given."""
    cache = model.new_cache(capacity=4)
    model(ids[:prompt], torch.arange(prompt), [Segment(cache, prompt)], logits_rows=[prompt - 1])
    cache.keep_all()
    steps = []
    for i in range(prompt, len(ids)):
        out = model.run(ids[i : i + 1], torch.tensor([i]), [Segment(cache, 1)])
        steps.append(out.logits)
        if outs is not None:
            outs.append(out)
        cache.keep_all()
    return torch.cat(steps), cache


def _eager(model):
    """The same model with its native step set aside (a context for one comparison)."""
    bound = model.native_step
    model.native_step = None
    return bound


@pytest.mark.parametrize("arch", COVERED)
def test_native_step_matches_eager_and_the_causal_forward(hf_checkpoints, arch):
    model = load_model(hf_checkpoints[arch][0])
    assert model.native_step is not None, native.unsupported(model)
    ids = torch.randint(0, 97, (40,), generator=torch.Generator().manual_seed(3))
    got, got_cache = _decode_one_by_one(model, ids)
    bound = _eager(model)
    expected, expected_cache = _decode_one_by_one(model, ids)
    model.native_step = bound
    assert _rel_err(got, expected) < 1e-5
    rows = slice(0, len(ids))
    assert torch.allclose(got_cache.keys[:, :, :, rows], expected_cache.keys[:, :, :, rows], atol=1e-5)
    assert torch.allclose(got_cache.values[:, :, :, rows], expected_cache.values[:, :, :, rows], atol=1e-5)
    assert _rel_err(got, model.logits(ids[None])[0, 5:]) < 1e-4


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_native_step_files_the_same_expert_statistics(hf_checkpoints, arch):
    model = load_model(hf_checkpoints[arch][0])
    ids = torch.randint(0, 97, (30,), generator=torch.Generator().manual_seed(4))
    counts = []
    for use_native in (True, False):
        bound = None if use_native else _eager(model)
        model.reset_expert_load()
        _decode_one_by_one(model, ids)
        counts.append((model.expert_load().clone(), model.experts_woken()))
        if bound is not None:
            model.native_step = bound
    assert torch.equal(counts[0][0], counts[1][0])
    assert counts[0][0].sum() > 0 and counts[0][1] == counts[1][1]


def test_experts_woken_by_a_verify_pass_are_the_distinct_layer_expert_pairs(hf_checkpoints):
    model = load_model(hf_checkpoints["qwen3_moe"][0])
    ids = torch.randint(0, 97, (7,), generator=torch.Generator().manual_seed(6))
    cache = model.new_cache(16)
    model(ids, torch.arange(7), [Segment(cache, 7)])
    pairs = {(layer, e) for layer, ids in enumerate(model.latest_routes()) for e in ids.reshape(-1).tolist()}
    assert model.experts_woken() == len(pairs) > len(model.moe_blocks()) * 2


def test_native_step_captures_the_layers_an_eagle_head_reads(hf_checkpoints):
    model = load_model(hf_checkpoints["qwen3_moe"][0])
    model.capture_layers = (0, 2)
    ids = torch.randint(0, 97, (12,), generator=torch.Generator().manual_seed(5))
    native_outs, eager_outs = [], []
    _decode_one_by_one(model, ids, outs=native_outs)
    bound = _eager(model)
    _decode_one_by_one(model, ids, outs=eager_outs)
    model.native_step = bound
    got, expected = native_outs[-1].captured, eager_outs[-1].captured
    assert got.shape == expected.shape == (1, 2 * model.config.hidden_size)
    assert torch.allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("arch", sorted(NOT_COVERED))
def test_families_it_does_not_cover_decode_eagerly_and_say_why(hf_checkpoints, arch):
    model = load_model(hf_checkpoints[arch][0])
    assert model.native_step is None
    assert NOT_COVERED[arch] in native.unsupported(model)


def test_rewriting_a_model_drops_its_native_step(tiny_models):
    model = load_model(tiny_models[0])
    assert model.native_step is not None
    assert quantize_int8(model).native_step is None  # int8 weights: the eager int8 path
    moved = load_model(tiny_models[0])
    moved.to(torch.float64)
    assert moved.native_step is None


def test_without_a_compiler_models_decode_eagerly(tiny_models, tmp_path):
    """No C compiler: a warning, and the same tokens from the eager step."""
    script = ("import torch; from specdec import load_model, Segment; from specdec_kernels import cpu_decode\n"
              f"m = load_model({str(tiny_models[0])!r})\n"
              "c = m.new_cache(); out = m(torch.tensor([5]), torch.tensor([0]), [Segment(c, 1)])\n"
              "print(m.native_step is None, out.shape[-1], cpu_decode.why_not())\n")
    env = {**os.environ, "CC": str(tmp_path / "no-such-compiler"), "SPECDEC_NATIVE_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("True "), done.stdout
    assert "no-such-compiler" in done.stdout and "decoding eagerly" in done.stderr


def test_each_build_runs_where_its_probe_passes_and_both_give_the_eager_tokens(tiny_models, tmp_path):
    """No -march=native: the avx2 build where the CPU runs it (else the baseline one), and
    SPECDEC_NATIVE_BUILD forces one; each decodes the same greedy tokens as the eager step."""
    script = ("import sys, torch; from specdec import load_model, Segment; from specdec_kernels import cpu_decode\n"
              f"m = load_model({str(tiny_models[0])!r})\n"
              "ids = [5, 77, 12, 9]\n"
              "for use in ('native', 'eager'):\n"
              "    c = m.new_cache()\n"
              "    if use == 'eager': m.native_step = None\n"
              "    out = m(torch.tensor(ids), torch.arange(4), [Segment(c, 4)])\n"
              "    print(use, out.argmax(-1).tolist())\n"
              "print('build', cpu_decode.build())\n")
    outputs = {}
    for build in ("avx2", "baseline"):
        env = {**os.environ, "SPECDEC_NATIVE_BUILD": build, "SPECDEC_NATIVE_CACHE": str(tmp_path / "cache")}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                              cwd=Path(__file__).resolve().parents[3])
        assert done.returncode == 0, done.stderr
        lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
        outputs[build] = lines
        if lines["build"] == "None":  # the avx2 build refused by this CPU: said so, decoded eagerly
            assert build == "avx2" and "probe failed" in done.stderr
            continue
        assert lines["build"] == build and lines["native"] == lines["eager"]
    assert sorted(path.name.split("-")[1] for path in (tmp_path / "cache").glob("*.so")) == ["avx2", "baseline"]


def test_the_shipped_models_decode_natively_with_the_eager_tokens():
    """ar through the engine, native against eager, on the shipped target and draft."""
    engine = Engine.from_pretrained()
    assert engine.target.native_step is not None and engine.draft.native_step is not None
    config = json.loads((default_model_dir() / "target" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    prompts = list(code_prompts(3, seed=11, before=400, after=60))
    native_tokens = [engine.complete(p, s, strategy="ar", max_tokens=24, mode="multi").tokens for _, p, s in prompts]
    bound = (_eager(engine.target), _eager(engine.draft))
    eager_tokens = [engine.complete(p, s, strategy="ar", max_tokens=24, mode="multi").tokens for _, p, s in prompts]
    engine.target.native_step, engine.draft.native_step = bound
    assert native_tokens == eager_tokens
    assert all(len(t) > 0 for t in native_tokens)


def _tree_mask(parents) -> torch.Tensor:
    """Ancestor-or-self mask [n, n] of a tree given each node's parent (-1: a root child)."""
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for node in range(len(parents)):
        walk = node
        while walk >= 0:
            mask[node, walk] = True
            walk = parents[walk]
    return mask


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2", "mixtral"])
def test_native_steps_of_several_tokens_match_eager(hf_checkpoints, arch):
    """A tree (verify pass), a causal chunk and a selection of logit rows, each against the
    eager step over the same cache."""
    model = load_model(hf_checkpoints[arch][0])
    ids = torch.randint(0, 97, (40,), generator=torch.Generator().manual_seed(8))
    parents = [-1, 0, 0, 1, 3, 2, -1]
    mask = _tree_mask(parents)
    tree_positions = 20 + mask.sum(1) - 1
    cases = [(ids[20:27], tree_positions, mask, None), (ids[20:25], torch.arange(20, 25), None, None),
             (ids[20:26], torch.arange(20, 26), None, [5]), (ids[20:24], torch.arange(20, 24), None, [0, 3])]
    for tokens, positions, tree, rows in cases:
        results = []
        for use_native in (True, False):
            bound = None if use_native else _eager(model)
            model.reset_expert_load()
            cache = model.new_cache(capacity=8)  # grows during the prefill and the step
            model(ids[:20], torch.arange(20), [Segment(cache, 20)], logits_rows=[19])
            cache.keep_all()
            logits = model(tokens, positions, [Segment(cache, len(tokens), tree)], logits_rows=rows)
            results.append((logits, cache.keys[:, :, :, : 20 + len(tokens)].clone(), model.expert_load().clone()))
            if bound is not None:
                model.native_step = bound
        (got, got_keys, got_load), (expected, expected_keys, expected_load) = results
        assert got.shape == expected.shape
        assert _rel_err(got, expected) < 1e-5
        assert torch.allclose(got_keys, expected_keys, atol=1e-5)
        assert torch.equal(got_load, expected_load)


@pytest.mark.parametrize("arch", ["qwen3_moe", "llama"])
def test_one_native_step_over_several_sequences_matches_eager(hf_checkpoints, arch):
    """Several users in one forward (a tree, a single token, a causal chunk riding along, each
    after its own cache's length): the logits of the rows asked for, every cache's new rows and
    the expert statistics, against the eager batched forward."""
    model = load_model(hf_checkpoints[arch][0])
    ids = torch.randint(0, 97, (60,), generator=torch.Generator().manual_seed(11))
    mask = _tree_mask([-1, 0, 0, 1, 2])
    cached = [17, 30, 9]  # committed tokens of each sequence, so each attends over its own cache
    steps = [(ids[40:45], cached[0] + mask.sum(1) - 1, mask), (ids[45:46], torch.tensor([cached[1]]), None),
             (ids[46:52], torch.arange(cached[2], cached[2] + 6), None)]
    rows = [0, 1, 2, 3, 4, 5, 11]  # the tree, the single token, the chunk's last row
    results = []
    for use_native in (True, False):
        bound = None if use_native else _eager(model)
        model.reset_expert_load()
        caches = []
        for start, length in zip((0, 5, 12), cached, strict=True):
            cache = model.new_cache(capacity=8)  # each grows for its step
            model(ids[start : start + length], torch.arange(length), [Segment(cache, length)], logits_rows=[length - 1])
            cache.keep_all()
            caches.append(cache)
        model.reset_expert_load()
        model.capture_layers = (1, 0, 1)  # as an EAGLE-3 head reads them; a tiny model repeats a layer
        segments = [Segment(cache, len(tokens), tree) for cache, (tokens, _, tree) in zip(caches, steps, strict=True)]
        assert bound is not None or model.native_step.takes(torch.cat([s[0] for s in steps]), segments, rows)
        out = model.run(torch.cat([s[0] for s in steps]), torch.cat([s[1] for s in steps]), segments, logits_rows=rows)
        keys = [c.keys[:, :, :, : c.length + c.pending].clone() for c in caches]
        values = [c.values[:, :, :, : c.length + c.pending].clone() for c in caches]
        results.append((out.logits, keys, values, model.expert_load().clone(), out.captured))
        model.capture_layers = ()
        if bound is not None:
            model.native_step = bound
    (got, got_keys, got_values, got_load, got_features), (expected, expected_keys, expected_values, expected_load,
                                                          expected_features) = results
    assert got_features.shape == expected_features.shape and _rel_err(got_features, expected_features) < 1e-5
    assert got.shape == expected.shape == (len(rows), model.config.vocab_size)
    assert _rel_err(got, expected) < 1e-5
    for mine, theirs in zip(got_keys + got_values, expected_keys + expected_values, strict=True):
        assert mine.shape == theirs.shape and torch.allclose(mine, theirs, atol=1e-5)
    assert torch.equal(got_load, expected_load)


def _decode_path(model, ids, prompt: int, path):
    """Logits and new cache rows of decoding `path` one token a step after a prefill."""
    cache = model.new_cache(capacity=prompt + len(path))
    model(ids[:prompt], torch.arange(prompt), [Segment(cache, prompt)], logits_rows=[prompt - 1])
    cache.keep_all()
    steps = []
    for depth, token in enumerate(path):
        steps.append(model(token.view(1), torch.tensor([prompt + depth]), [Segment(cache, 1)]))
        cache.keep_all()
    return torch.cat(steps), cache


@pytest.mark.parametrize("which", ["qwen3_moe", "llama", "target", "draft"])
def test_a_tree_node_gets_bit_for_bit_the_logits_of_its_path_decoded_alone(hf_checkpoints, which):
    """What keeps speculation exactly lossless on the native step: a verify pass over a tree
    (siblings masked between a node and its ancestors, another user batched alongside) gives
    each node of a path the very logits and cache rows that decoding the path one token a step
    gives, not merely close ones."""
    # the shipped draft has one kv head, so its decode step splits a pass's heads across threads
    model = load_model(default_model_dir() / which if which in ("target", "draft") else hf_checkpoints[which][0])
    assert model.native_step is not None
    vocab = model.config.vocab_size
    ids = torch.randint(0, min(vocab, 4000), (80,), generator=torch.Generator().manual_seed(5))
    prompt, path = 61, ids[61:65]
    expected, expected_cache = _decode_path(model, ids, prompt, path)
    # nodes: path[0], a sibling, path[1], its sibling, path[2], path[3]
    parents = [-1, -1, 0, 0, 2, 4]
    tokens = torch.stack([path[0], ids[70], path[1], ids[71], path[2], path[3]])
    mask = _tree_mask(parents)
    on_path = [0, 2, 4, 5]
    for other_user in (False, True):
        cache = model.new_cache(capacity=prompt + len(tokens))
        model(ids[:prompt], torch.arange(prompt), [Segment(cache, prompt)], logits_rows=[prompt - 1])
        cache.keep_all()
        segments, step_ids, positions = [Segment(cache, len(tokens), mask)], [tokens], [prompt + mask.sum(1) - 1]
        if other_user:
            other = model.new_cache(capacity=40)
            model(ids[:30], torch.arange(30), [Segment(other, 30)], logits_rows=[29])
            other.keep_all()
            segments.append(Segment(other, 3))
            step_ids.append(ids[30:33])
            positions.append(torch.arange(30, 33))
        logits = model(torch.cat(step_ids), torch.cat(positions), segments)
        assert torch.equal(logits[on_path], expected)
        for depth, node in enumerate(on_path):
            assert torch.equal(cache.keys[:, :, :, prompt + node], expected_cache.keys[:, :, :, prompt + depth])
            assert torch.equal(cache.values[:, :, :, prompt + node], expected_cache.values[:, :, :, prompt + depth])


def test_bf16_copies_change_no_logit_and_are_made_only_where_exact(hf_checkpoints):
    """The shipped (bf16) target's step reads bf16 copies of its matrices and gives the logits
    the fp32 reads give, bit for bit; a model whose fp32 weights bf16 cannot hold gets none."""
    model = load_model(default_model_dir() / "target")
    assert model.native_step.half_bytes > 0
    ids = torch.randint(0, 4000, (40,), generator=torch.Generator().manual_seed(2))
    halves, _ = _decode_path(model, ids, 30, ids[30:36])
    model.native_step = native.NativeStep(model, native.cpu_decode.library(), halves=False)
    assert model.native_step.half_bytes == 0
    fp32, _ = _decode_path(model, ids, 30, ids[30:36])
    assert torch.equal(halves, fp32)
    tiny = load_model(hf_checkpoints["qwen3_moe"][0])
    assert tiny.native_step is not None and tiny.native_step.half_bytes == 0


def test_a_weight_edited_in_place_after_binding_sends_steps_eager_until_rebound():
    """The bf16 copies would be stale: the step declines, the forward runs eagerly on the new
    weights, and binding again brings the native step back with fresh copies."""
    model = load_model(default_model_dir() / "target")
    ids = torch.randint(0, 4000, (24,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        model.model.layers[0].self_attn.o_proj.weight.mul_(0.5)  # still exact in bf16
    edited, _ = _decode_path(model, ids, 16, ids[16:20])
    assert model.native_step.stale
    bound = _eager(model)
    eager, _ = _decode_path(model, ids, 16, ids[16:20])
    model.native_step = bound
    assert torch.equal(edited, eager)
    assert native.bind(model) and not model.native_step.stale
    rebound, _ = _decode_path(model, ids, 16, ids[16:20])
    assert model.native_step.half_bytes > 0 and _rel_err(rebound, eager) < 1e-5


def test_a_native_forward_returns_its_logits_as_numpy_and_an_eager_one_a_view(hf_checkpoints):
    """Acceptance reads a forward's logits as numpy (ForwardOut.rows): a native forward's are the
    array it wrote (the rows asked for), an eager forward's a view of its own tensor."""
    model = load_model(hf_checkpoints["qwen3_moe"][0])
    ids = torch.randint(0, 97, (9,), generator=torch.Generator().manual_seed(8))
    cache = model.new_cache(16)
    out = model.run(ids[:6], torch.arange(6), [Segment(cache, 6)], logits_rows=[2, 5])
    assert out.array is not None and out.array.shape == (2, model.config.vocab_size)
    assert out.rows() is out.array and torch.equal(torch.from_numpy(out.array), out.logits)
    cache.keep_all()
    bound = _eager(model)
    eager = model.run(ids[6:], torch.arange(6, 9), [Segment(cache, 3)])
    model.native_step = bound
    assert eager.array is None and eager.rows().shape == (3, model.config.vocab_size)
    assert torch.equal(torch.from_numpy(eager.rows()), eager.logits)
