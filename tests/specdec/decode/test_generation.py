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


def test_a_prefill_feeds_the_head_its_prompt_before_the_first_step(tmp_path, tiny_models):
    """An EAGLE-3 request's head is in step with the prompt once prefill ends, so its first
    drafting step feeds one row; the output stays the target's own."""
    from specdec import Engine
    from specdec.models.loader import load_model
    from tests.specdec.models.test_eagle import _write_head

    target = load_model(tiny_models[0])
    _write_head(tmp_path / "head", target)
    engine = Engine.from_pretrained(tiny_models[0], tmp_path / "head", adaptive=False)
    (_, prefix, suffix), = code_prompts(1, seed=23, before=500, after=80)
    g = generation(engine, prefix, suffix, strategy="draft", max_tokens=8, mode="multi")
    engine.scheduler.submit(g)
    while g.state is not State.DECODING:
        engine.scheduler.step()
    assert g.eagle.synced == len(g.committed) - 2 and g.eagle.cache.length == g.eagle.synced
    while not g.is_finished:
        engine.scheduler.step()
    reference = engine.complete(prefix, suffix, strategy="ar", max_tokens=8, mode="multi", use_prompt_cache=False)
    assert g.result().tokens == reference.tokens and g.stats.tree_nodes > 0
