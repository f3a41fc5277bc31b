"""Every strategy's greedy output equals the target's own greedy output, token for token."""

import pytest

from prefixcache import Index
from specdec import STRATEGIES, Engine, load_model
from tests.helpers import STDLIB, code_prompts, generation


@pytest.fixture(scope="module")
def engine(tiny_models):
    target, draft = tiny_models
    index = Index.build(STDLIB / "json", workers=1)
    return Engine(load_model(target), load_model(draft), index, adaptive=False)  # always speculate


def test_all_strategies_match_ar_on_50_prompts(engine):
    mismatches = []
    for i, (_path, prefix, suffix) in enumerate(code_prompts(50)):
        options = dict(max_tokens=12, mode="multi" if i % 2 else "auto", path=None)
        engine.prompt_cache.clear()
        reference = engine.complete(prefix, suffix, strategy="ar", use_prompt_cache=False, **options)
        for strategy in STRATEGIES:
            for use_cache in (True, False):
                got = engine.complete(prefix, suffix, strategy=strategy, use_prompt_cache=use_cache, **options)
                if got.tokens != reference.tokens or got.text != reference.text:
                    mismatches.append((i, strategy, use_cache))
    assert mismatches == []


def test_batched_equals_alone(engine):
    prompts = code_prompts(6, seed=1)
    alone = [engine.complete(p, s, strategy="hybrid", max_tokens=10, mode="multi").tokens for _, p, s in prompts]
    gens = [generation(engine, p, s, strategy=strat, max_tokens=10, mode="multi")
            for (_, p, s), strat in zip(prompts, ["hybrid", "ar", "draft", "ngram", "trie", "hybrid"], strict=True)]
    engine.scheduler.run_until_done(gens)
    assert [g.result().tokens for g in gens] == alone


def test_speculation_accepts_tokens(engine):
    """With the target as its own draft, draft tokens are always accepted (tau well above 1)."""
    twin = Engine(engine.target, engine.target, None, adaptive=False)
    twin.draft_min_prob = 0.0  # a draft as costly as the target is not worth it; force drafting anyway
    _, prefix, suffix = code_prompts(1, seed=3)[0]
    result = twin.complete(prefix, suffix, strategy="draft", max_tokens=24, mode="multi")
    assert result.stats["accepted_by_source"]["draft"] > 0
    assert result.stats["tau"] > 1.5
    assert result.tokens == twin.complete(prefix, suffix, strategy="ar", max_tokens=24, mode="multi").tokens
