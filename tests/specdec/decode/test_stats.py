"""Stats: read as a mapping, serialised."""

import json

import pytest

from specdec import Stats


def test_stats_read_as_a_mapping_and_serialise():
    stats = Stats(target_passes=4, generated_tokens=10, tau=2.5, stop_reason="word", stop_word="END")
    assert stats["tau"] == 2.5 and stats.get("missing", 7) == 7 and "stop_word" in stats
    assert dict(stats)["accepted_by_source"] == {"trie": 0, "draft": 0, "ngram": 0, "history": 0, "bonus": 0}
    assert json.loads(json.dumps(stats.as_dict()))["stop_word"] == "END"
    with pytest.raises(KeyError):
        stats["nope"]
