"""The suggestion history: typing along, and repeats continued from the cursor."""

from specdec import Engine, load_model
from tests.helpers import typed_along


def test_typing_along_a_suggestion_is_proposed_from_history(tiny_models):
    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]), adaptive=False)
    accepted, steps = 0, 0
    for typed, suffix in typed_along(engine):
        reference = engine.complete(typed, suffix, strategy="ar", max_tokens=16, mode="multi", document="other.py")
        follow = engine.complete(typed, suffix, strategy="hybrid", max_tokens=16, mode="multi", document="doc.py")
        assert follow.tokens == reference.tokens  # lossless like every source
        accepted += follow.stats.accepted_by_source["history"]
        steps += 1
    assert steps >= 3 and accepted >= 4 * steps, (accepted, steps)


def test_history_knows_when_the_text_runs_along_a_suggestion():
    from specdec.decode.history import SuggestionHistory

    history = SuggestionHistory()
    prefix = "def area(radius):\n    "
    history.record("doc", prefix, "return math.pi * radius * radius\n")
    typed = prefix + "return math.pi * ra"
    assert history.typing_along("doc", typed, length=12)
    assert history.typing_along("doc", prefix + "return math", ".pi * ra", length=12)  # the tail spans both
    assert not history.typing_along("doc", prefix + "print('something else entirely')", length=12)
    assert not history.typing_along("other", typed, length=12)
    assert not history.typing_along("doc", prefix + "return math.pi * radius * radius\n", length=12)  # nothing left


def test_a_repetitive_suggestion_is_continued_from_where_the_user_is_along_it():
    """In a run like `str, str, ...` the tail also matches near the suggestion's end; the rest
    proposed must start where the user is (the first match past the cursor), and a repeated
    request (nothing typed yet) gets the whole suggestion."""
    from specdec.decode.history import SuggestionHistory

    history = SuggestionHistory()
    prefix = "import typing\n\n" + "x = 1\n" * 10 + "Row = tuple["
    suggestion = ", ".join(["str"] * 40) + "]\n"
    history.record("doc", prefix, suggestion)
    (rest, from_suggestion), *_ = history.continuations("doc", prefix + "str")
    assert from_suggestion and rest == suggestion[3:3 + 320]
    (whole, _), *_ = history.continuations("doc", prefix)
    assert whole == suggestion[:320]
    assert history.typing_along("doc", prefix + suggestion[:-12])  # the last match is near the end; this one is not


def test_the_text_after_the_cursor_is_searched_after_the_text_before_it():
    """A branch whose twin stands below the cursor: its tail is found there, and what followed
    it is proposed (from_suggestion False); the text before the cursor still comes first."""
    from specdec.decode.history import SuggestionHistory

    history = SuggestionHistory()
    before = "def parse(kind, raw):\n    if kind == 'json':\n        return json.loads(raw)\n    elif kind == 'yaml':\n"
    after = "\n    elif kind == 'toml':\n        return toml.loads(raw, strict=True)\n"
    typed = before + "        return "
    assert history.continuations("doc", typed) == [("json.loads(raw)\n    elif kind == 'yaml':\n        return", False)]
    below = before.replace("json.loads(raw)", "load(raw)") + "        return toml."
    assert history.continuations("doc", below) == []
    (rest, from_suggestion), *_ = history.continuations("doc", below, after=after)
    assert not from_suggestion and rest.startswith("loads(raw, strict=True)\n")
    assert history.continuations("doc", below, after="\nunrelated = 1\n") == []


def test_a_twin_line_after_the_cursor_becomes_a_history_path_and_decoding_stays_lossless(tiny_models):
    """The history paths read the request's text after the cursor, tokenized as trie candidates
    are; through the engine the output stays ar's."""
    from specdec.decode.drafting import history_paths
    from specdec.decode.history import SuggestionHistory
    from specdec.decode.policy import AcceptanceStats

    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]), adaptive=False)
    prefix = "def pairs(items):\n    out = []\n    for key, value in"
    suffix = "\n\ndef again(items):\n    for key, value in items.items():\n        print(key)\n"
    encode, stats = engine.prompts.encode, AcceptanceStats()
    assert history_paths(SuggestionHistory(), "doc", prefix, encode, "", stats) == []
    (path,) = history_paths(SuggestionHistory(), "doc", prefix, encode, "", stats, after=suffix)
    assert path.source == "history" and path.tokens == encode(" items.items():\n        print(key)\n")
    reference = engine.complete(prefix, suffix, strategy="ar", max_tokens=16, mode="multi")
    assert engine.complete(prefix, suffix, strategy="hybrid", max_tokens=16, mode="multi").tokens == reference.tokens
