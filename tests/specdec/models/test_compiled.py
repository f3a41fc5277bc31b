"""The compiled CPU step (torch.compile of the per-token stretches) computes what the eager
step does: prefill, a tree with its mask, decode, and a batch of sequences in one forward, and
greedy speculation through it stays lossless."""

import pytest
import torch

from specdec import Engine, Segment, load_model
from specdec.models.compiled import compile_step, uncompile_step
from tests.helpers import code_prompts


@pytest.fixture(scope="module")
def models(tiny_models):
    target, _ = tiny_models
    compiled = load_model(target)
    seconds = compile_step(compiled)
    assert seconds > 0
    return load_model(target), compiled


def _steps(model):
    """Logits of a prefill, a 4-node tree (two branches), a decode step, and a batch of two sequences."""
    ids = torch.arange(5, 45)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    with torch.inference_mode():
        a, b = model.new_cache(64), model.new_cache(64)
        out = [model(ids[:30], torch.arange(30), [Segment(a, 30)], logits_rows=[29])]
        a.keep_all()
        out.append(model(ids[30:34], torch.tensor([30, 31, 31, 32]), [Segment(a, 4, tree)]))
        a.keep([0, 2, 3])
        out.append(model(ids[34:35], torch.tensor([33]), [Segment(a, 1)]))
        a.keep_all()
        model(ids[:7], torch.arange(7), [Segment(b, 7)])
        b.keep_all()
        out.append(model(torch.cat([ids[35:38], ids[7:9]]), torch.tensor([34, 35, 36, 7, 8]),
                         [Segment(a, 3), Segment(b, 2)]))
    return out


def test_compiled_step_equals_eager(models):
    eager, compiled = models
    for got, expected in zip(_steps(compiled), _steps(eager), strict=True):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_speculation_through_the_compiled_step_is_lossless(models, tiny_models):
    _, compiled = models
    engine = Engine(compiled, load_model(tiny_models[1]), None, adaptive=False)
    for _, prefix, suffix in code_prompts(6, seed=7):
        reference = engine.complete(prefix, suffix, strategy="ar", max_tokens=8, mode="multi").tokens
        assert engine.complete(prefix, suffix, strategy="hybrid", max_tokens=8, mode="multi").tokens == reference


def test_uncompile_restores_eager(tiny_models):
    model = load_model(tiny_models[0])
    compile_step(model, warm_up=False)
    uncompile_step(model)
    assert model.step.seam.__name__ == "_seam"
