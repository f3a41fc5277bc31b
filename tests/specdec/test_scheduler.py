"""Scheduler: chunked, batched prefill; superseding hands the older request's caches on."""

import torch

from specdec import Engine, load_model
from tests.helpers import code_prompts, generation


def _engine(tiny_models):
    return Engine(load_model(tiny_models[0]), load_model(tiny_models[1]), adaptive=False)


def test_request_superseded_while_prefilling_hands_over_its_cache(tiny_models):
    engine = _engine(tiny_models)
    scheduler = engine.scheduler
    _, prefix, suffix = code_prompts(1, seed=5, before=2000)[0]
    first = generation(engine, prefix, suffix, max_tokens=8, document="doc")
    second = generation(engine, prefix + "x", suffix, max_tokens=8, document="doc")
    busy = generation(engine, "a = 1\n", "", max_tokens=200, mode="multi")  # decoding, so the budget is small
    scheduler.submit(busy)
    scheduler.step()
    scheduler.submit(first)
    scheduler.step()  # one chunk of the first prompt
    assert first.prefilling and first.cache.length == scheduler.PREFILL_TOKENS_BUSY
    scheduler.submit(second)  # the next keystroke
    while not second.finished.is_set():
        scheduler.step()
    assert first.stop_reason == "superseded" and first.generated == []
    assert second.stats["cached_tokens"] >= scheduler.PREFILL_TOKENS_BUSY
    busy.request_cancel()
    scheduler.step()


def test_chunked_batched_prefill_equals_whole_prefill(tiny_models):
    """Prompts prefilled in budgeted chunks, batched with other prompts and decoding requests,
    give the same greedy tokens as each prompt completed alone."""
    engine = _engine(tiny_models)
    prompts = code_prompts(4, seed=7, before=1500)
    alone = [engine.complete(p, s, max_tokens=10, mode="multi", use_prompt_cache=False).tokens for _, p, s in prompts]
    engine.scheduler.PREFILL_TOKENS_IDLE = 100  # force chunking even with nobody decoding
    gens = [generation(engine, p, s, max_tokens=10, mode="multi", use_prompt_cache=False) for _, p, s in prompts]
    with torch.inference_mode():
        engine.scheduler.run_until_done(gens)
    assert [g.result().tokens for g in gens] == alone
    assert all(g.stats["prefill_tokens"] > 100 for g in gens)


def test_submitting_twice_does_not_supersede_the_request_itself(tiny_models):
    engine = _engine(tiny_models)
    _, prefix, suffix = code_prompts(1, seed=3, before=300)[0]
    g = generation(engine, prefix, suffix, max_tokens=4, document="doc")
    engine.scheduler.submit(g)
    engine.scheduler.run_until_done([g])  # submits again
    assert g.stop_reason != "superseded" and g.result().tokens
