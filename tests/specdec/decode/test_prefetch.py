"""Prefetch: the request after an accept, computed while idle, taken only when it is that request."""

import time

import pytest

from specdec import CompletionOptions, Engine, load_model
from specdec.decode.prefetch import Prefetcher, PrefetchLimits, accepted_variants, after_accepting, token_key
from specdec.decode.states import State
from tests.helpers import code_prompts, generation


@pytest.fixture(scope="module")
def models(tiny_models):
    return load_model(tiny_models[0]), load_model(tiny_models[1])


def _engine(models, **kwargs):
    return Engine(*models, adaptive=False, **kwargs)


def _options(seed=11, **changes):
    _, prefix, suffix = code_prompts(1, seed=seed, before=600)[0]
    return CompletionOptions(prefix, suffix, max_tokens=12, mode="multi", document="doc", **changes)


def _cold(models, options):
    return _engine(models, prefetch=False).complete(options.prefix, options.suffix, max_tokens=options.max_tokens,
                                                    mode=options.mode, temperature=options.temperature,
                                                    top_p=options.top_p, seed=options.seed, use_prompt_cache=False)


def _run_background(engine, limit=500):
    """Step an idle engine inline until its prefetch jobs have finished."""
    for _ in range(limit):
        if engine.prefetcher.next_runnable() is None:
            return
        engine.scheduler.step()
    raise AssertionError("prefetch jobs did not finish")


def test_accepting_grows_the_prefix_and_drops_a_retyped_line_end():
    options = CompletionOptions("x = f(a", ")\nreturn x\n", time_budget_ms=300, wait_budget_ms=50, slot="s")
    accepted = after_accepting(options, ", b)")
    assert (accepted.prefix, accepted.suffix) == ("x = f(a, b)", "\nreturn x\n")
    assert after_accepting(options, ", b").suffix == options.suffix  # nothing typed again: the suffix stays
    assert accepted.time_budget_ms is None and accepted.wait_budget_ms is None and accepted.slot is None
    assert accepted_variants("a\nb") == ["a\nb", "a"] and accepted_variants("ab") == ["ab"]
    assert accepted_variants("\nb") == ["\nb"] and accepted_variants("") == []


def test_time_limits_and_routing_do_not_decide_the_tokens():
    options = CompletionOptions("a", "b")
    assert token_key(options) == token_key(options.with_changes(time_budget_ms=5.0, document="d", strategy="ar"))
    assert token_key(options) != token_key(options.with_changes(max_tokens=3))
    assert token_key(options) != token_key(options.with_changes(suffix="c"))
    lines = CompletionOptions("top\nmiddle\n    x = ", "b")
    assert token_key(lines) == token_key(lines.with_changes(prefix="middle\n    x = "))  # the prompt ids tell the rest
    assert token_key(lines) != token_key(lines.with_changes(prefix="top\nmiddle\n  x = "))


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_p": 0.9, "seed": 7}], ids=["greedy", "seeded"])
def test_a_finished_prefetch_answers_at_once_with_the_cold_tokens(models, sampling):
    engine = _engine(models)
    options = _options(**sampling)
    shown = engine.complete(**_kwargs(options))
    assert shown.text
    engine.prefetch(options, shown.text)
    _run_background(engine)
    accepted = after_accepting(options, shown.text).with_changes(time_budget_ms=400.0)
    served = engine.complete(**_kwargs(accepted))
    assert served.stats.prefetched == "served"
    assert served.tokens == _cold(models, accepted).tokens
    counts = engine.metrics().prefetch
    assert counts.served == 1 and counts.cpu_s > 0


def test_a_running_prefetch_is_joined_and_its_tokens_count(models):
    engine = _engine(models)
    options = _options(seed=12).with_changes(max_tokens=40)
    shown = engine.complete(**_kwargs(options))
    engine.prefetch(options, shown.text)
    job = engine.prefetcher.jobs[0]
    while job.generation.state is not State.DECODING or not job.generation.generated:
        engine.scheduler.step()
    done_before = list(job.generation.generated)
    accepted = after_accepting(options, shown.text)
    joined = engine.complete(**_kwargs(accepted))
    assert joined.stats.prefetched == "joined"
    assert joined.tokens[: len(done_before)] == done_before
    assert joined.tokens == _cold(models, accepted).tokens
    assert engine.metrics().prefetch.joined == 1


def test_a_joined_prefetch_counts_its_prediction_time_against_the_time_limit(models):
    engine = _engine(models)
    options = _options(seed=12).with_changes(max_tokens=40)
    shown = engine.complete(**_kwargs(options))
    engine.prefetch(options, shown.text)
    job = engine.prefetcher.jobs[0].generation
    while job.state is not State.DECODING or len(job.generated) < 3:
        engine.scheduler.step()
    time.sleep(0.06)  # the job has predicted for longer than the request will allow
    predicted = len(job.generated)
    accepted = after_accepting(options, shown.text).with_changes(time_budget_ms=50.0)
    joined = engine.complete(**_kwargs(accepted))
    assert joined.stats.prefetched == "joined" and joined.stats.stop_reason == "time"
    assert len(joined.tokens) <= predicted + 1  # at most the one step that noticed the time
    cold = _cold(models, accepted).tokens
    assert len(joined.tokens) < len(cold) and joined.tokens == cold[: len(joined.tokens)]


def test_typing_something_else_drops_the_documents_prefetches_into_the_prompt_cache(models):
    engine = _engine(models)
    options = _options(seed=13)
    shown = engine.complete(**_kwargs(options))
    engine.prefetch(options, shown.text)
    _run_background(engine)
    typed = options.with_changes(prefix=options.prefix + "zq")
    result = engine.complete(**_kwargs(typed))
    assert result.stats.prefetched == ""
    assert result.stats.cached_tokens > 0
    counts = engine.metrics().prefetch
    assert counts.wasted == len(accepted_variants(shown.text)) and counts.wasted_cpu_s == counts.cpu_s > 0
    assert engine.prefetcher.jobs == [] and engine.prefetcher.dropped == []


def test_a_live_request_goes_before_a_running_prefetch(models):
    engine = _engine(models)
    options = _options(seed=14)
    engine.prefetch(options, "value = 1\n")
    engine.scheduler.step()  # the job begins and prefills its first chunk
    job = engine.prefetcher.jobs[0].generation
    assert job.prefilling
    length = job.cache.length
    live = generation(engine, "def f(x):\n    return", "", max_tokens=6, document="other")
    engine.scheduler.submit(live)
    while not live.is_finished:
        engine.scheduler.step()
        assert job.cache.length == length  # not one background pass while a request was live
    engine.scheduler.step()
    assert job.cache.length > length


def test_jobs_are_bounded_per_document_and_in_all():
    prefetcher = Prefetcher(PrefetchLimits(per_document=2, total=3))

    for document in ("a", "b", "c"):
        prefetcher.queue(CompletionOptions("x", document=document), "one\ntwo", lambda options: _FakeJob())
    assert [job.document for job in prefetcher.jobs] == ["b", "c", "c"]
    assert prefetcher.snapshot().started == 6 and prefetcher.snapshot().wasted == 3
    prefetcher.queue(CompletionOptions("y", document="c"), "three", lambda options: _FakeJob())  # a new suggestion
    assert [job.document for job in prefetcher.jobs] == ["b", "c"]


def test_the_latest_suggestions_jobs_run_first_whole_before_first_line():
    prefetcher = Prefetcher()
    for document in ("a", "b"):
        prefetcher.queue(CompletionOptions("x", document=document), "one\ntwo", lambda options: _FakeJob())
    first = prefetcher.next_runnable()
    assert first.document == "b" and first.key == token_key(CompletionOptions("xone\ntwo"))
    first.generation.is_finished = True
    assert prefetcher.next_runnable().key == token_key(CompletionOptions("xone"))


def test_prefetch_runs_only_on_a_started_engine_and_can_be_turned_off(models):
    engine = _engine(models)
    options = _options(seed=15)
    engine.complete(**_kwargs(options))
    assert engine.prefetcher.jobs == []  # inline: nobody would step it
    engine.start()
    try:
        shown = engine.submit(options.with_changes(prefix=options.prefix + "\n")).result(timeout=60)
        deadline = time.monotonic() + 60  # queued once the loop has reaped the request, just after its answer
        while (not engine.prefetcher.jobs or engine.prefetcher.next_runnable()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert shown.text and engine.metrics().prefetch.started >= 1
        assert all(job.generation.is_finished for job in engine.prefetcher.jobs)
        engine.set_prefetch(False)
        assert engine.prefetcher.jobs == []
        engine.submit(options.with_changes(prefix=options.prefix + "\n\n")).result(timeout=60)
        assert engine.prefetcher.jobs == []
    finally:
        engine.stop()


class _FakeJob:
    """A job's generation as the Prefetcher's bookkeeping sees it."""

    is_finished, prompt, max_tokens = False, None, 8

    def request_cancel(self, reason):
        self.reason = reason


def _kwargs(options: CompletionOptions) -> dict:
    return {name: value for name, value in vars(options).items()}
