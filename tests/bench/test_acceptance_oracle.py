"""The acceptance-oracle bench's arithmetic on passes whose costs are known."""

import pytest

from bench.acceptance_oracle import interpolate, oracle, path_acceptance

CURVE = {1: 2.0, 2: 2.5, 4: 3.0}


def row(passes, ar_ms=100.0, ar_decode_ms=80.0, paths=()):
    return {"ar_ms": ar_ms, "ar_decode_ms": ar_decode_ms, "passes": passes, "paths": list(paths), "same": True}


def test_the_curve_is_interpolated_and_extended_per_token():
    assert interpolate(CURVE, 1) == 2.0 and interpolate(CURVE, 3) == pytest.approx(2.75)
    assert interpolate(CURVE, 8) == pytest.approx(6.0)  # 3.0 for 4 tokens, per token beyond


def test_the_oracle_pays_only_for_accepted_tokens():
    # two passes: 3 history tokens accepted (4 tokens for cost(4) = 3.0), then none (a plain step)
    result = oracle([row([[("history", 1), ("history", 2), ("history", 3)], []])], CURVE, draft_ratio=0.5)
    plain, spent = 5 * 2.0, 3.0 + 2.0
    assert result["decode"] == pytest.approx(plain / spent)
    assert result["tau"] == pytest.approx(2.5)
    decode = 80.0 * spent / plain
    assert result["per_point_median"] == pytest.approx(100.0 / (20.0 + decode), abs=1e-4)


def test_accepted_draft_tokens_cost_their_draft_forwards_and_served_trees_cost_more():
    passes = [[("draft", 1), ("draft", 2), ("trie", 3)]]
    drafted = oracle([row(passes)], CURVE, draft_ratio=0.5)
    assert drafted["decode"] == pytest.approx(8.0 / (3.0 + 2 * 0.5 * 2.0))  # two draft forwards
    served = oracle([row(passes)], CURVE, draft_ratio=0.5, served_scale=2.0, python_ms=0.25)
    assert served["decode"] == pytest.approx(8.0 / (2.0 + 1.0 * 2.0 + 0.25 + 2.0))


def test_paths_are_tallied_by_source_and_step():
    paths = [{"source": "trie", "first_step": True, "followed": 2, "length": 4},
             {"source": "trie", "first_step": True, "followed": 0, "length": 4},
             {"source": "trie", "first_step": False, "followed": 1, "length": 2}]
    found = {(p["source"], p["step"]): p for p in path_acceptance([row([], paths=paths)])}
    assert found[("trie", "first")]["first_followed"] == 0.5 and found[("trie", "first")]["mean_followed"] == 1.0
    assert found[("trie", "later")]["paths"] == 1
