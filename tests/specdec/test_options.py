"""CompletionOptions: validated once, sequences kept as tuples."""

import pytest

from specdec import CompletionOptions, OptionsError


@pytest.mark.parametrize("field, value, words", [("strategy", "beam", "strategy"), ("mode", "block", "mode"),
                                                 ("top_p", 0.0, "top_p"), ("max_tokens", -1, "max_tokens"),
                                                 ("temperature", -0.5, "temperature"), ("top_k", -2, "top_k")])
def test_options_are_validated_once_with_the_field_named(field, value, words):
    with pytest.raises(OptionsError, match=words):
        CompletionOptions("x = ", **{field: value})


def test_options_keep_sequences_as_tuples():
    options = CompletionOptions("x", extra=[("a.py", "y = 1")], stop=["\n\n"])
    assert options.extra == (("a.py", "y = 1"),) and options.stop == ("\n\n",)
    assert options.with_changes(document="d").document == "d" and options.document is None


def test_each_strategy_names_its_sources_in_one_table():
    from specdec import DEFAULT_STRATEGY, PLAIN, STRATEGIES, STRATEGY_TABLE

    assert STRATEGIES == tuple(STRATEGY_TABLE) and PLAIN == "ar" and DEFAULT_STRATEGY == "hybrid"
    assert not STRATEGY_TABLE[PLAIN].speculates
    assert all(STRATEGY_TABLE[name].speculates for name in STRATEGIES if name != PLAIN)
    hybrid = CompletionOptions("x", strategy="hybrid").sources
    assert (hybrid.trie, hybrid.history, hybrid.draft, hybrid.ngram) == (True, True, True, False)
    assert CompletionOptions("x", strategy="ngram").sources.ngram and not CompletionOptions("x").sources.ngram
