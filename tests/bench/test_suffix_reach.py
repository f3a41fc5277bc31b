"""Replaying a completion token by token against the proposal sources, on a tiny real index."""

import json

import pytest

from bench.suffix_reach import ar_rows, passes_needed, replay_point, tail_continuations, tokens_spelled
from prefixcache import Index
from specdec_eval.points import Point

ROUTES = '''def install(app):
    app.router.add_route("/health", health_check, methods=["GET"])
    app.router.add_route("/ready", ready_check, methods=["GET"])
'''


def test_a_proposal_is_worth_the_whole_tokens_it_spells_from_the_start():
    assert tokens_spelled(["abcX"], "abcdef", [2, 4, 6]) == 1  # 3 characters: the first token only
    assert tokens_spelled(["ab", "abcdefgh"], "abcdef", [2, 4, 6]) == 3
    assert tokens_spelled(["x"], "abcdef", [2, 4, 6]) == 0
    assert tokens_spelled([], "abcdef", [2]) == 0


def test_a_pass_takes_at_most_the_budget_and_the_bonus_token():
    assert passes_needed([0, 0, 0], 3) == 3
    assert passes_needed([2, 0, 0, 5, 0, 0, 0, 0], 3) == 3  # 2 + 1, then 3 + 1, then the last alone
    assert passes_needed([7, 0, 0, 0, 0, 0, 0, 0], 7) == 1
    assert passes_needed([], 3) == 0


def test_continuations_are_ranked_by_their_line_and_keep_what_follows_it():
    haystacks = ["x = f(a)\ny = 1\n", "x = f(a)\ny = 1\n", "x = f(b)\n"]
    assert tail_continuations("result: x = f(", haystacks, tails=(6,)) == ["a)", "b)"]
    whole = tail_continuations("result: x = f(", haystacks, tails=(6,), lines=False, chars=9)
    assert whole == ["a)\ny = 1\n", "b)\n"]


def test_the_repository_search_spells_a_completion_another_file_holds(tmp_path):
    (tmp_path / "routes.py").write_text(ROUTES)
    (tmp_path / "app.py").write_text("import routes\n")
    index = Index.build(tmp_path)
    prefix = 'def setup(app):\n    app.router.add_route("/ready", ready'
    point = Point("app.py", prefix, "", "_check, methods=[\"GET\"])", "single")
    pieces = ["_check", ",", " methods", "=[", "\"", "GET", "\"])"]
    alone, added = replay_point(index, point, pieces, [ROUTES])
    assert added[0] == len(pieces)  # routes.py holds the rest of the line after the tail
    assert all(a <= b for a, b in zip(alone, added, strict=True))
    assert len(alone) == len(added) == len(pieces)


def test_a_replay_needs_an_eval_runs_ar_rows(tmp_path):
    with pytest.raises(SystemExit, match="not an eval run"):
        ar_rows(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"strategies": {"ar": {}, "hybrid": {}}}))
    rows = [{"path": "a.py", "who": name} for name in ("ar", "ar", "hybrid", "hybrid")]
    (tmp_path / "points.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r["who"] for r in ar_rows(tmp_path)[1]] == ["ar", "ar"]
    (tmp_path / "results.json").write_text(json.dumps({"strategies": {"hybrid": {}}}))
    with pytest.raises(SystemExit, match="no `ar` rows"):
        ar_rows(tmp_path)
