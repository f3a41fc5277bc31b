"""Prompt cache: a request for another document copies the shared head instead of taking the entry."""

from specdec import Engine, load_model
from tests.helpers import code_prompts


def test_other_document_copies_the_shared_head_and_the_first_keeps_its_cache(tiny_models):
    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]))
    (_, context, _), (_, prefix_a, suffix_a), (_, prefix_b, suffix_b) = code_prompts(3, seed=21, before=600, after=150)
    extra = ({"filename": "shared.py", "text": context},)
    requests = [(prefix_a, suffix_a), (prefix_b, suffix_b), (prefix_a + "x", suffix_a)]  # A, B, then A's next keystroke
    expected = [engine.complete(p, s, max_tokens=6, extra=extra, use_prompt_cache=False).tokens for p, s in requests]
    results = [engine.complete(p, s, max_tokens=6, extra=extra) for p, s in requests]
    assert [r.tokens for r in results] == expected
    first, other, keystroke = (r.stats for r in results)
    assert other["cached_tokens"] >= 100  # the repository context, copied from A's entry
    assert keystroke["prefill_tokens"] <= 8 < first["prefill_tokens"] // 10  # A's entry was still there
    assert len(engine.prompt_cache.entries) == 2


def test_a_request_that_drafts_nothing_keeps_the_drafts_cache_for_the_next(tiny_models):
    """hybrid, then ar, then hybrid on the same prompt: the ar request took the entry and must
    give back the draft's cache with it, or the second hybrid request re-prefills its whole
    prompt with the draft (half the points of an interleaved eval paid that)."""
    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]))
    (_, prefix, suffix), = code_prompts(1, seed=5, before=600, after=100)
    engine.complete(prefix, suffix, strategy="hybrid", max_tokens=0)
    engine.complete(prefix, suffix, strategy="ar", max_tokens=4)
    (entry,) = engine.prompt_cache.entries
    assert entry.draft is not None and entry.draft.length >= len(entry.tokens) - 8
    synced = {}
    original = engine.draft.forward

    def counting(ids, *args, **kwargs):
        synced["fed"] = synced.get("fed", 0) + len(ids)
        return original(ids, *args, **kwargs)

    engine.draft.forward = counting
    reference = engine.complete(prefix, suffix, strategy="ar", max_tokens=4, use_prompt_cache=False)
    result = engine.complete(prefix, suffix, strategy="hybrid", max_tokens=4)
    assert result.tokens == reference.tokens
    assert synced.get("fed", 0) < 40  # a few drafted tokens, not the ~600-character prompt again
