"""Generation: its states, stop strings, cancellation and statistics."""

import pytest

from specdec import CompletionOptions, IllegalTransition, State
from tests.helpers import code_prompts, generation


def test_result_names_the_stop_string_that_matched(engine):
    _, prefix, suffix = code_prompts(1, seed=21, before=400)[0]
    free = engine.complete(prefix, suffix, strategy="ar", max_tokens=12, mode="multi", use_prompt_cache=False)
    assert len(free.text) >= 4, free.text
    word = free.text[2:4]
    stopped = engine.complete(prefix, suffix, strategy="ar", max_tokens=12, mode="multi", use_prompt_cache=False,
                              stop=("\x00never\x00", word))
    assert stopped.stats.stop_reason == "word" and stopped.stats.stop_word == word
    assert stopped.text == free.text[: free.text.find(word)]


def test_generation_walks_its_states_in_order(engine):
    _, prefix, suffix = code_prompts(1, seed=22, before=300)[0]
    g = generation(engine, prefix, suffix, max_tokens=3, strategy="ar", use_prompt_cache=False)
    assert g.state is State.QUEUED
    with pytest.raises(IllegalTransition):
        g.commit(None, None)  # nothing to commit before decoding
    seen = [g.state]
    engine.scheduler.submit(g)
    while not g.is_finished:
        engine.scheduler.step()
        if g.state is not seen[-1]:
            seen.append(g.state)
    assert seen[0] is State.QUEUED and seen[-1] is State.FINISHED
    assert set(seen) <= {State.QUEUED, State.PREFILLING, State.DECODING, State.FINISHED}
    assert g.stop_reason == "limit" and len(g.generated) == 3


def test_illegal_transitions_raise(engine):
    g = generation(engine, "x = ", "", max_tokens=2, use_prompt_cache=False)
    g.finish("cancelled")
    assert g.stop_reason == "cancelled" and g.finished.is_set()
    with pytest.raises(IllegalTransition, match="finished to finished"):
        g.finish("limit")  # a reason once recorded is never silently replaced
    with pytest.raises(IllegalTransition):
        g.begin()
    assert g.stop_reason == "cancelled"


def test_cancel_from_the_caller_is_acted_on_between_steps(engine):
    handle = engine.submit(CompletionOptions("def f():\n    ", max_tokens=50, mode="multi", use_prompt_cache=False))
    handle.cancel()
    result = handle.result()
    assert result.stats.stop_reason == "cancelled" and result.tokens == []


def test_stats_count_tree_nodes_and_experts_woken(engine):
    _, prefix, suffix = code_prompts(1, seed=41, before=300)[0]
    result = engine.complete(prefix, suffix, strategy="hybrid", max_tokens=6, mode="multi", use_prompt_cache=False)
    cfg = engine.target.config
    passes = result.stats.target_passes
    assert result.stats.tree_nodes >= passes  # each pass verifies its root at least
    assert passes * len(cfg.sparse_layers) <= result.stats.experts_woken <= passes * len(cfg.sparse_layers) * cfg.num_experts
