"""Proposing: a tree's paths cut where the completion must end."""

import pytest


def test_a_single_line_tree_stops_at_its_paths_first_newline(engine, monkeypatch):
    """A single-line completion ends at its first newline, so no tree node may follow one; a
    multi-line completion's paths run on across lines."""
    from specdec.decode import proposing

    offered, grow = [], proposing.grow_tree

    def recording(tree, paths, *args, **kwargs):
        offered.extend(paths)
        return grow(tree, paths, *args, **kwargs)

    monkeypatch.setattr(proposing, "grow_tree", recording)
    newline = engine.prompts.newline_ids
    prefix = "value = compute(alpha, beta)\nresult = value + 1\n" * 3 + "value = comp"

    def crossing():
        return [p for p in offered if any(t in newline for t in p.tokens[:-1])]

    engine.complete(prefix, "", mode="single", strategy="hybrid", max_tokens=8)
    assert offered and not crossing()
    offered.clear()
    engine.complete(prefix, "", mode="multi", strategy="hybrid", max_tokens=32)
    assert crossing()  # the repeat runs past the line's end: the cut above had work to do


def test_no_tree_node_lies_past_the_token_limit(engine, monkeypatch):
    from specdec.decode.generation import Generation

    steps, propose = [], Generation.propose

    def recording(self, *args, **kwargs):
        tree = propose(self, *args, **kwargs)
        steps.append((self.max_tokens - len(self.generated), max(tree.depths)))
        return tree

    monkeypatch.setattr(Generation, "propose", recording)
    prefix = "value = compute(alpha, beta)\nresult = value + 1\n" * 3 + "value = comp"
    for limit in (3, 5, 9):
        engine.complete(prefix, "", mode="multi", strategy="hybrid", max_tokens=limit)
    assert steps and all(depth <= left for left, depth in steps)
    assert any(depth == left for left, depth in steps)  # the repeat is long: the limit did cut


def test_the_draft_sits_out_the_steps_that_run_along_a_suggestion(tiny_models, monkeypatch):
    """Adaptive, a step along the target's own earlier suggestion proposes the suggestion's rest
    and runs no draft forward; forced, the draft still drafts there; both give the target's tokens."""
    from specdec import Engine, load_model
    from specdec.decode import proposing
    from specdec.decode.drafting import DraftRunner
    from tests.helpers import typed_along

    events, along, chain = [], proposing._along_a_suggestion, DraftRunner.chain
    monkeypatch.setattr(proposing, "_along_a_suggestion", lambda g, ctx: events.append(("along", along(g, ctx))) or
                        events[-1][1])
    monkeypatch.setattr(DraftRunner, "chain", lambda self, *a, **k: events.append(("draft", True)) or chain(self, *a, **k))
    target, draft = load_model(tiny_models[0]), load_model(tiny_models[1])
    for adaptive in (True, False):
        engine = Engine(target, draft, adaptive=adaptive)
        steps_along, drafted_along = 0, 0
        for typed, suffix in typed_along(engine):
            reference = engine.complete(typed, suffix, strategy="ar", max_tokens=16, mode="multi", document="x.py")
            events.clear()
            follow = engine.complete(typed, suffix, strategy="hybrid", max_tokens=16, mode="multi", document="doc.py")
            assert follow.tokens == reference.tokens
            for (kind, value), following in zip(events, events[1:] + [("end", None)], strict=True):
                if kind == "along" and value:
                    steps_along += 1
                    drafted_along += following[0] == "draft"
        if adaptive:
            assert steps_along >= 3 and drafted_along == 0, (steps_along, drafted_along)
        else:  # forced: no step asks whether it runs along; the draft drafts at every step
            assert steps_along == 0 and sum(kind == "draft" for kind, _ in events) > 0


def test_a_draft_token_must_pay_for_its_draft_step_and_its_tree_node_together(tiny_models, monkeypatch):
    """The adaptive floor of a chain's chance for another draft forward is the draft step's cost
    plus the verify cost of one more tree node, both over a target step: either alone let chains
    grow that cost more than they won. A token whose forward is paid keeps the node's alone."""
    from specdec import Engine, load_model
    from specdec.decode.budget import VerifyCost, min_useful_prob
    from specdec.decode.drafting import DraftRunner

    asked, kept, chain = [], [], DraftRunner.chain
    monkeypatch.setattr(DraftRunner, "chain", lambda self, committed, depth, floor, *a, **k:
                        asked.append(floor) or kept.append(k["keep_prob"]) or chain(self, committed, depth, floor, *a, **k))
    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]))
    engine.draft_min_prob = 0.2
    engine.verify_cost = VerifyCost((1, 2, 4), (10.0, 11.0, 13.0))  # one more node: a tenth of a step
    policy = engine.policies.prior
    # Both as the first step sees them: served forwards re-measure the cost curve afterwards.
    node = min_useful_prob(engine.verify_cost) / policy.acceptance.draft_scale
    expected = 0.2 / policy.acceptance.draft_scale + node
    engine.complete("def add(a, b):\n    return", "", strategy="draft", max_tokens=4, mode="multi")
    assert asked
    assert asked[0] == pytest.approx(min(0.95, expected))
    # a token whose forward is paid needs only to pay for its node
    assert kept[0] == pytest.approx(node) and node < asked[0]


def test_draft_steps_count_the_passes_the_draft_drafted_for(tiny_models):
    from specdec import Engine, load_model

    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]), adaptive=False)
    result = engine.complete("def add(a, b):\n    return", "", strategy="hybrid", max_tokens=6, mode="multi",
                             document="doc.py")
    assert result.stats.draft_steps == result.stats.target_passes > 0  # forced: the draft drafts at every step
    plain = engine.complete("def add(a, b):\n    return", "", strategy="trie", max_tokens=6, mode="multi")
    assert plain.stats.draft_steps == 0 and plain.stats.target_passes > 0


def _seed_speeds(policy, key: str, faster: str, steps: int = 8) -> None:
    """Measured speeds as if `steps` steps of each kind had run, the `faster` kind ten times faster."""
    for _ in range(steps):
        policy.record_step(key, True, 1.0 if faster == "spec" else 10.0, 1)
        policy.record_step(key, False, 1.0 if faster == "plain" else 10.0, 1)


REPEATING = "value = compute(alpha, beta)\nresult = value + 1\n" * 3 + "value = comp"


def test_the_lookups_propose_at_every_step_whatever_the_measured_speeds(tiny_models, monkeypatch):
    """Without a draft, speculating steps measured ten times slower than plain ones do not turn
    the lookups off: each step's tree is priced node by node, and the tokens are the target's.
    The text's tail repeats only 12 characters (what a plain step once searched for was 24 or
    more), so only a full lookup proposes here."""
    from specdec import Engine, load_model
    from specdec.decode import proposing

    engine = Engine(load_model(tiny_models[0]))
    prefix = "z = 1\nalpha_beta(gamma, delta)\nprint(1)\nalpha_beta("
    reference = engine.complete(prefix, "", strategy="ar", max_tokens=12, mode="multi")
    _seed_speeds(engine.policies.for_document("doc.py"), "hybrid", faster="plain")
    offered, paths = [], proposing._paths
    monkeypatch.setattr(proposing, "_paths", lambda g, ctx, acceptance, draft=True:
                        offered.append(draft) or paths(g, ctx, acceptance, draft=draft))
    result = engine.complete(prefix, "", strategy="hybrid", max_tokens=12, mode="multi", document="doc.py")
    assert result.tokens == reference.tokens
    assert offered and not any(offered) and len(offered) == result.stats.target_passes
    assert result.stats.tree_nodes > 0 and result.stats.draft_steps == 0


@pytest.mark.parametrize("draft_pays", [False, True])
def test_the_draft_drafts_where_steps_with_it_measured_faster(tiny_models, monkeypatch, draft_pays):
    """With a draft, the measured speeds choose between steps with the draft and steps with the
    lookups alone; either way the lookups propose and the tokens are the target's. The steps
    served are learned into the same speeds."""
    from specdec import Engine, load_model
    from specdec.decode.drafting import DraftRunner

    chains, chain = [], DraftRunner.chain
    monkeypatch.setattr(DraftRunner, "chain", lambda self, *a, **k: chains.append(1) or chain(self, *a, **k))
    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]))
    reference = engine.complete(REPEATING, "", strategy="ar", max_tokens=12, mode="multi")
    policy = engine.policies.for_document("doc.py")
    _seed_speeds(policy, "hybrid", faster="spec" if draft_pays else "plain")
    chains.clear()
    result = engine.complete(REPEATING, "", strategy="hybrid", max_tokens=12, mode="multi", document="doc.py")
    assert result.tokens == reference.tokens and result.stats.tree_nodes > 0
    passes = result.stats.target_passes
    assert result.stats.draft_steps == len(chains) == (passes if draft_pays else 0), (len(chains), passes)
    assert policy.samples["hybrid"]["spec" if draft_pays else "plain"] == 8 + passes
