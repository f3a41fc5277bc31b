"""The policy replay's arithmetic on logged positions whose outcomes are known."""

import pytest

from bench.acceptance_oracle import interpolate
from bench.policy_sim import AcceptanceTable, accepted_length, calibration, gated, oracle, replay, step_costs
from specdec.decode.tree import TokenTree

SERVED = {1: (2.0, 500), 2: (3.0, 60), 3: (3.4, 5)}  # size 3 served too rarely to trust
CURVE = {1: 2.0, 2: 2.5, 4: 3.5, 8: 5.0}


def step(position, paths, confidence=0.5, draft_ms=0.0, draft_forwards=1):
    return {"position": position, "paths": paths, "confidence": [confidence, 0.0], "trie_ms": 0.3,
            "history_ms": 0.0, "draft_ms": draft_ms, "draft_forwards": draft_forwards}


def row(tokens, steps, ar_ms=100.0, ar_decode_ms=80.0):
    return {"ar_ms": ar_ms, "ar_decode_ms": ar_decode_ms, "tokens": tokens, "same": True, "steps": steps}


def plain(step, confidence, costs, tokens=None):
    return TokenTree(0), 0.0


def test_costs_take_served_sizes_then_the_curves_growth():
    costs = step_costs(SERVED, CURVE, largest=8)
    assert costs[1] == 2.0 and costs[2] == 3.0
    assert costs[3] == pytest.approx(3.0 + 3.0 - 2.5)  # size 3 had 5 steps: the curve grows from size 2
    assert costs[8] == pytest.approx(3.0 + 5.0 - 2.5)
    assert all(a <= b for a, b in zip(costs, costs[1:], strict=False))


def test_a_size_served_too_rarely_is_interpolated_between_trusted_ones():
    served = {1: (2.0, 500), 2: (9.0, 3), 4: (5.0, 40)}  # size 2: three stalled steps
    costs = step_costs(served, CURVE, largest=6)
    assert costs[2] == pytest.approx(3.0) and costs[3] == pytest.approx(4.0) and costs[4] == 5.0
    assert costs[6] == pytest.approx(5.0 + interpolate(CURVE, 6) - 3.5)


def test_plain_steps_replay_as_ar():
    rows = [row([1, 2, 3], [step(i, []) for i in range(3)])]
    result = replay(rows, plain, step_costs(SERVED, CURVE))
    assert result["per_point_median"] == 1.0 and result["tau"] == 1.0 and result["speculating_steps"] == 0.0


def test_the_oracle_verifies_the_paying_path_and_skips_the_positions_it_covered():
    # at position 0 a history path has the next three tokens right, a trie path only one
    steps = [step(0, [("history:48", [1, 2, 3, 9], [0.9] * 4), ("trie:0", [1, 7], [0.5, 0.4])])]
    steps += [step(i, []) for i in range(1, 5)]
    costs = step_costs(SERVED, CURVE)
    result = replay([row([1, 2, 3, 4, 5], steps)], oracle, costs)
    spent = costs[4] + 1 * costs[1]  # one pass of 4 nodes (3 accepted + bonus), then the last position plain
    assert result["tau"] == pytest.approx(5 / 2)
    assert result["decode"] == pytest.approx(5 * costs[1] / spent, abs=1e-4)


def test_the_oracle_leaves_a_draft_path_whose_forwards_cost_more_than_it_saves():
    steps = [step(0, [("draft", [1], [0.9])], draft_ms=10.0), step(1, [])]
    tree, proposing = oracle(steps[0], None, step_costs(SERVED, CURVE), tokens=[1, 2])
    assert len(tree) == 1 and proposing == 0.0


def test_the_table_counts_each_depth_given_the_ones_before():
    # history path proposed twice at later steps: its first token right both times, the second once
    steps = [step(0, []), step(1, [("history:24", [2, 3], [0.9, 0.8])]), step(2, [("history:24", [3, 9], [0.9, 0.8])])]
    table = AcceptanceTable([row([1, 2, 3, 4], steps)])
    first = table.chance("history:24", 0, 1, 0.5, 0.9)
    assert first == pytest.approx((2 + 0.5) / (2 + 2))
    second = table.chance("history:24", 1, 1, 0.5, 0.8)
    assert second == pytest.approx((1 + 0.5) / (2 + 2))
    assert table.chance("history:12", 0, 1, 0.5, 0.9) == 0.25  # never seen


def test_a_gated_policy_uses_only_the_sources_it_is_given_and_pays_for_the_draft():
    paths = [("history:48", [1, 2, 3], [0.9] * 3), ("history:12", [1, 2, 3], [0.9] * 3), ("draft", [1, 2], [0.9, 0.8])]
    steps = [step(0, paths, draft_ms=3.0, draft_forwards=3)]
    table = AcceptanceTable([row([1, 2, 3, 4], steps + [step(i, []) for i in range(1, 4)])] * 5)
    costs = step_costs(SERVED, CURVE)
    tree, _ = gated(table, history=("history:24",))(steps[0], None, costs)
    assert len(tree) == 1  # no history path of a tail it takes, no trie or draft
    tree, proposing = gated(table, history=(), draft_first=True)(steps[0], None, costs)
    assert set(tree.sources[1:]) == {"draft"} and proposing == pytest.approx(3.0)  # 2 tokens: all 3 forwards


def test_accepted_length_walks_the_tree_along_the_tokens():
    tree = TokenTree(0)
    a = tree.add_child(0, 1, "trie", 1.0)
    tree.add_child(a, 2, "trie", 1.0)
    tree.add_child(0, 5, "draft", 1.0)
    assert accepted_length(tree, [1, 2, 3]) == 2
    assert accepted_length(tree, [5, 2]) == 1
    assert accepted_length(tree, [7]) == 0


def test_calibration_groups_later_steps_by_what_a_step_knows():
    steps = [step(0, [("draft", [1], [0.99])]),  # a completion's first step: left out
             step(1, [("draft", [2], [0.9]), ("trie:1", [7], [0.5])], confidence=0.97),
             step(2, [("draft", [9], [0.1]), ("history:24", [3], [0.9])])]
    found = {(c["source"], c["from"]): c for c in calibration([row([1, 2, 3], steps)])}
    assert found[("draft", 0.8)]["first_followed"] == 1.0 and found[("draft", 0.0)]["first_followed"] == 0.0
    assert found[("trie", 0.5)]["paths"] == 1 and found[("trie", 0.5)]["first_followed"] == 0.0  # after step 0's 0.5
    assert found[("history:24", 0.95)]["first_followed"] == 1.0  # after step 1's 0.97
    assert sum(c["paths"] for c in found.values()) == 4


def test_the_logging_hooks_run_on_the_engine_as_it_is(tiny_models, tmp_path):
    """log_positions and served_step_ms patch the engine's proposing and stepping: a change to
    those internals that they no longer fit (a renamed attribute, a new argument) fails here, where
    it once failed only when someone next ran the bench."""
    from bench.policy_sim import log_positions, served_step_ms
    from prefixcache import Index
    from specdec import Engine, load_model
    from specdec_eval.points import sample_points

    repo = tmp_path / "repo"
    repo.mkdir()
    for i in range(3):
        (repo / f"m{i}.py").write_text(f"def f{i}(x):\n    value = x + {i}\n    return value * 2\n\n"
                                       f"def g{i}(y):\n    return f{i}(y) + {i}\n")
    index = Index.build(repo, workers=1)
    target, draft = load_model(tiny_models[0]), load_model(tiny_models[1])
    plain, forced = Engine(target, draft, index), Engine(target, draft, index, adaptive=False)
    points = sample_points(repo, 3, 1, "auto")
    served = served_step_ms(plain, Engine(target, draft, index), index, points, max_tokens=8)
    assert served.get(1, (0.0, 0))[1] > 0 and all(ms >= 0.0 for ms, _ in served.values())
    rows = log_positions(forced, plain, index, points, max_tokens=8)
    assert len(rows) == 3 and all(row["same"] for row in rows)
    steps = [step for row in rows for step in row["steps"]]
    assert steps and all({"paths", "trie_ms", "history_ms", "draft_ms", "confidence"} <= step.keys() for step in steps)
