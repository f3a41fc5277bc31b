"""Prompt cache: a request for another document copies the shared head instead of taking the entry."""

from specdec import Engine, load_model
from tests.helpers import code_prompts


def test_other_document_copies_the_shared_head_and_the_first_keeps_its_cache(tiny_models):
    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]))
    (_, context, _), (_, prefix_a, suffix_a), (_, prefix_b, suffix_b) = code_prompts(3, seed=21, before=900, after=150)
    extra = ({"filename": "shared.py", "text": context},)
    requests = [(prefix_a, suffix_a), (prefix_b, suffix_b), (prefix_a + "x", suffix_a)]  # A, B, then A's next keystroke
    expected = [engine.complete(p, s, max_tokens=6, extra=extra, use_prompt_cache=False).tokens for p, s in requests]
    results = [engine.complete(p, s, max_tokens=6, extra=extra) for p, s in requests]
    assert [r.tokens for r in results] == expected
    first, other, keystroke = (r.stats for r in results)
    assert other["cached_tokens"] >= 100  # the repository context, copied from A's entry
    assert keystroke["prefill_tokens"] <= 8 < first["prefill_tokens"] // 10  # A's entry was still there
    assert len(engine.prompt_cache.entries) == 2
