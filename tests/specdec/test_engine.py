"""Engine: metrics, a request's FIM order, and when it warms up."""

import pytest

from specdec import CompletionOptions, Engine, OptionsError
from tests.helpers import code_prompts


def test_engine_metrics_report_finished_requests(engine):
    engine.complete("import os\n", "", max_tokens=2, strategy="ar", document="doc-metrics")
    metrics = engine.metrics()
    record = metrics.recent[-1]
    assert record.document == "doc-metrics" and record.stop_reason is not None and record.tokens <= 2
    assert metrics.queue_depth == 0 and len(metrics.expert_load) == 2 and metrics.documents >= 1


def test_a_request_may_choose_its_fim_order(engine, tiny_models):
    _, prefix, suffix = code_prompts(1, seed=23, before=300)[0]
    psm_engine = Engine(engine.target, engine.draft, adaptive=False, fim_mode="psm")
    asked = engine.complete(prefix, suffix, strategy="ar", max_tokens=8, mode="multi", fim_mode="psm",
                            use_prompt_cache=False)
    built = psm_engine.complete(prefix, suffix, strategy="ar", max_tokens=8, mode="multi", use_prompt_cache=False)
    default = engine.complete(prefix, suffix, strategy="ar", max_tokens=8, mode="multi", use_prompt_cache=False)
    assert engine.prompt_for(prefix, suffix, fim_mode="psm").ids == psm_engine.prompt_for(prefix, suffix).ids
    assert asked.tokens == built.tokens and asked.tokens != default.tokens  # the engine's own order is spm
    with pytest.raises(OptionsError, match="fim mode 'suffix_first': the qwen format has spm, psm"):
        engine.submit(CompletionOptions(prefix, suffix, fim_mode="suffix_first"))
    with pytest.raises(OptionsError, match="fim_mode"):
        CompletionOptions(prefix, fim_mode="middle_first")


def test_an_attached_index_and_a_remembered_suggestion_reach_the_next_request(engine, tmp_path):
    """What the server and eval change on a running engine reaches every generation through its
    DecodeContext: the index the trie proposes from, and suggestions to type along."""
    from prefixcache import Index

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "zoo.py").write_text("zebra_total = count_zebras(herd)\n")
    engine.attach_index(Index.build(tmp_path, workers=1))
    assert engine.decode.index is engine.index and engine.index.propose("zebra_to")[0].text == "tal = count_zebras(herd)"
    reference = engine.complete("zebra_to", "", strategy="ar", max_tokens=6, mode="multi")
    from_trie = engine.complete("zebra_to", "", strategy="trie", max_tokens=6, mode="multi", use_prompt_cache=False)
    assert from_trie.tokens == reference.tokens and from_trie.stats.tree_nodes > from_trie.stats.target_passes
    engine.remember_suggestion("zoo.py", "def herd(", "zebras, count):\n    return count\n")
    assert engine.history.typing_along("zoo.py", "def herd(zebras, co", length=12)
    engine.attach_index(None)
    assert engine.decode.index is None


def test_only_a_request_that_speculates_waits_for_the_warm_up(engine):
    """The verify cost is measured over real passes (half a minute on a real CPU target); plain
    decoding never reads it, so a deferred warm-up waits for the first request that speculates."""
    fresh = Engine(engine.target, engine.draft, warm_up=False)
    plain = fresh.complete("import os\n", "", max_tokens=4, strategy="ar")
    assert fresh.verify_cost is None and fresh.draft_min_prob is None
    speculated = fresh.complete("import os\n", "", max_tokens=4, strategy="hybrid")
    assert fresh.verify_cost is not None and fresh.draft_min_prob is not None
    assert speculated.tokens == plain.tokens
