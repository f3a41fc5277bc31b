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


def test_a_strict_budget_ends_the_completion_with_what_it_has(tiny_models):
    """Stopped at its budget, a completion is the head of the one it would have been."""
    engine = _engine(tiny_models)
    whole = engine.complete("a = 1\n", "", max_tokens=300, mode="multi", use_prompt_cache=False)
    cut = engine.complete("a = 1\n", "", max_tokens=300, mode="multi", use_prompt_cache=False, time_budget_ms=40)
    assert whole.stats.stop_reason != "time" and len(whole.tokens) > len(cut.tokens)
    assert cut.stats.stop_reason == "time" and cut.tokens == whole.tokens[: len(cut.tokens)]
    assert cut.stats.decode_ms < 40 + 200  # at most the step that crossed the deadline after it


def test_a_step_that_would_end_past_a_strict_deadline_is_not_started(tiny_models):
    """With steps measured at 10 s, a 5 s budget ends the completion before its first step."""
    engine = _engine(tiny_models)
    engine.warm_up()
    measured = engine.verify_cost
    engine.verify_cost = lambda nodes, riding=0: 10_000.0
    try:
        result = engine.complete("a = 1\n", "", max_tokens=300, mode="multi", time_budget_ms=5000)
    finally:
        engine.verify_cost = measured
    assert result.stats.stop_reason == "time" and result.stats.decode_ms < 1000


def test_a_request_that_would_wait_past_its_budget_is_answered_at_once(tiny_models):
    engine = _engine(tiny_models)
    scheduler = engine.scheduler
    waiting = [generation(engine, f"x_{i} = {i}\n", "", max_tokens=32, document=f"d{i}")
               for i in range(scheduler.MAX_DECODING + 2)]
    for g in waiting:
        scheduler.submit(g)
    for _ in range(40):
        scheduler.load.waited(400.0)  # the latest requests waited 400 ms before decoding
    late = generation(engine, "y = 2\n", "", max_tokens=32, time_budget_ms=250, document="late")
    scheduler.submit(late)
    assert late.is_finished and late.stop_reason == "busy" and late.prompt is None
    assert late.result().stats.expected_wait_ms > 250 and late not in scheduler.waiting
    patient = generation(engine, "y = 2\n", "", max_tokens=32, time_budget_ms=250, wait_budget_ms=2000,
                         document="patient")
    scheduler.submit(patient)
    assert not patient.is_finished  # it waits up to 2 s for prediction to start: queued
    unbounded = generation(engine, "y = 2\n", "", max_tokens=32, document="unbounded")
    scheduler.submit(unbounded)
    assert not unbounded.is_finished
    warming = generation(engine, "y = 2\n", "", max_tokens=0, time_budget_ms=1, document="warm")
    scheduler.submit(warming)
    assert not warming.is_finished  # cache warming generates nothing: no budget to miss
    scheduler.run_until_done(waiting + [patient, unbounded, warming])


def test_requests_for_one_client_slot_supersede_each_other(tiny_models):
    engine = _engine(tiny_models)
    first = generation(engine, "a = 1\n", "", max_tokens=8, document="one.py", slot="client:0")
    second = generation(engine, "b = 2\n", "", max_tokens=8, document="two.py", slot="client:0")
    other = generation(engine, "c = 3\n", "", max_tokens=8, document="three.py", slot="client:1")
    for g in (first, second, other):
        engine.scheduler.submit(g)
    engine.scheduler.run_until_done([second, other])
    assert first.stop_reason == "superseded" and second.stop_reason != "superseded"
    assert other.stop_reason != "superseded"


def test_under_load_few_requests_begin_per_step_and_each_generates_less(tiny_models):
    engine = _engine(tiny_models)
    scheduler = engine.scheduler
    busy = generation(engine, "a = 1\n", "", max_tokens=200, mode="multi", document="busy")
    scheduler.submit(busy)
    scheduler.step()  # decoding now
    crowd = [generation(engine, f"v_{i} = {i}\n", "", max_tokens=64, mode="multi", document=f"c{i}") for i in range(8)]
    for g in crowd:
        scheduler.submit(g)
    scheduler.step()
    assert sum(g.prompt is not None for g in crowd) == scheduler.ADMIT_BUSY
    scheduler.run_until_done(crowd)
    capped = [g.result() for g in crowd if g.stats.tokens_cap]
    assert capped and all(r.stats.tokens_cap == scheduler.LOAD_TOKEN_CAP and len(r.tokens) <= r.stats.tokens_cap
                          for r in capped)
    busy.request_cancel()
    scheduler.step()


def test_a_request_a_user_waits_on_goes_before_a_burst_of_keystrokes(tiny_models):
    """A keystroke that superseded its document's live request is part of a burst: a request
    nobody superseded (a user waiting on it) prefills and decodes first."""
    engine = _engine(tiny_models)
    scheduler = engine.scheduler
    busy = generation(engine, "a = 1\n", "", max_tokens=200, mode="multi", document="busy")
    scheduler.submit(busy)
    scheduler.step()
    _, long_prefix, suffix = code_prompts(1, seed=9, before=2000)[0]
    waited_on = generation(engine, long_prefix, suffix, max_tokens=8, document="paused")
    scheduler.submit(waited_on)
    scheduler.step()  # begun; its first chunk
    keystrokes = [generation(engine, "w = 1" + "0" * i + "\n", "", max_tokens=8, document="typing") for i in range(3)]
    for g in keystrokes:
        scheduler.submit(g)
    burst = keystrokes[-1]
    assert burst.in_burst and not waited_on.in_burst
    before = waited_on.cache.length
    scheduler.step()  # the burst's survivor begins, yet the waited-on prompt gets the step's prefill first
    assert waited_on.cache.length - before == scheduler.PREFILL_TOKENS_BUSY and burst.prefilling
    while waited_on.prefilling:
        scheduler.step()
    assert scheduler._decoding() and burst not in scheduler._decoding()  # young burst requests wait
    burst.started -= scheduler.QUIET_MS / 1000  # then the user paused: it is waited on too
    scheduler.step()
    assert burst in scheduler._decoding() or burst.is_finished
    busy.request_cancel()
    scheduler.run_until_done([waited_on, burst])


def test_requests_decoding_together_price_their_trees_as_riding_together(tiny_models, monkeypatch):
    """Each request's tree is told how many other requests' tokens share its step, and the
    policy keeps those steps' speeds apart."""
    from specdec.decode.generation import Generation

    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]))
    seen = []
    real = Generation.propose
    monkeypatch.setattr(Generation, "propose", lambda self, riding=0: seen.append(riding) or real(self, riding))
    gens = [generation(engine, p, s, max_tokens=6, mode="multi", strategy="draft", document=f"d{i}")
            for i, (_, p, s) in enumerate(code_prompts(3, seed=11, before=400))]
    with torch.inference_mode():
        engine.scheduler.run_until_done(gens)
    assert 2 in seen  # three requests decoding: two others ride with each tree
    assert any(key.endswith(" batched") for key in engine.policies.prior.step_speed)
