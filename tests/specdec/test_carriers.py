"""The typed carriers between layers, the generation's states, the handle and per-document policies."""

import asyncio
import json

import pytest

from specdec import CompletionOptions, Engine, IllegalTransition, OptionsError, State, Stats, load_model
from specdec.decode.drafting import DraftPath, ngram_paths
from specdec.decode.policy import AcceptanceStats, PolicyBook
from tests.helpers import code_prompts, generation


@pytest.fixture(scope="module")
def engine(tiny_models):
    return Engine(load_model(tiny_models[0]), load_model(tiny_models[1]), adaptive=False)


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


def test_stats_read_as_a_mapping_and_serialise():
    stats = Stats(target_passes=4, generated_tokens=10, tau=2.5, stop_reason="word", stop_word="END")
    assert stats["tau"] == 2.5 and stats.get("missing", 7) == 7 and "stop_word" in stats
    assert dict(stats)["accepted_by_source"] == {"trie": 0, "draft": 0, "ngram": 0, "history": 0, "bonus": 0}
    assert json.loads(json.dumps(stats.as_dict()))["stop_word"] == "END"
    with pytest.raises(KeyError):
        stats["nope"]


def test_draft_paths_are_typed():
    paths = ngram_paths([1, 2, 3, 9, 1, 2, 3], AcceptanceStats())
    assert paths and all(isinstance(p, DraftPath) for p in paths)
    assert paths[0].source == "ngram" and paths[0].tokens[0] == 9 and len(paths[0].probs) == len(paths[0].tokens)


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


def test_handle_streams_deltas_that_add_up_to_the_result(engine):
    _, prefix, suffix = code_prompts(1, seed=23, before=300)[0]
    reference = engine.complete(prefix, suffix, strategy="ar", max_tokens=10, mode="multi")
    engine.start()
    try:
        async def follow():
            handle = engine.submit(CompletionOptions(prefix, suffix, strategy="hybrid", max_tokens=10, mode="multi"))
            deltas = [d async for d in handle.deltas()]
            return deltas, await handle.wait()

        deltas, result = asyncio.run(follow())
    finally:
        engine.stop()
    assert result.tokens == reference.tokens
    assert reference.text.startswith("".join(deltas))


def test_each_document_prices_its_own_trees():
    book = PolicyBook(max_documents=2)
    a, b = book.for_document("a.py"), book.for_document("b.py")
    a.acceptance.update("trie", 4, 0, rate=0.5)  # a.py's trie proposals all rejected
    assert a.acceptance.first["trie"] < b.acceptance.first["trie"] == book.prior.acceptance.first["trie"]
    book.for_document("c.py")  # evicts the least recently used (a.py)
    assert len(book) == 2 and book.for_document("a.py").acceptance.first["trie"] == book.prior.acceptance.first["trie"]


def test_engine_metrics_report_finished_requests(engine):
    engine.complete("import os\n", "", max_tokens=2, strategy="ar", document="doc-metrics")
    metrics = engine.metrics()
    record = metrics.recent[-1]
    assert record.document == "doc-metrics" and record.stop_reason is not None and record.tokens <= 2
    assert metrics.queue_depth == 0 and len(metrics.expert_load) == 2 and metrics.documents >= 1


def test_typing_along_a_suggestion_is_proposed_from_history(tiny_models):
    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]), adaptive=False)
    accepted, steps = 0, 0
    for _path, prefix, suffix in code_prompts(6, seed=31, before=500, after=100):
        shown = engine.complete(prefix, suffix, max_tokens=24, mode="multi", document="doc.py")
        if len(shown.text) < 8:
            continue
        typed = prefix + shown.text[:3]
        reference = engine.complete(typed, suffix, strategy="ar", max_tokens=16, mode="multi", document="other.py")
        follow = engine.complete(typed, suffix, strategy="hybrid", max_tokens=16, mode="multi", document="doc.py")
        assert follow.tokens == reference.tokens  # lossless like every source
        accepted += follow.stats.accepted_by_source["history"]
        steps += 1
    assert steps >= 3 and accepted >= 4 * steps, (accepted, steps)


def test_stats_count_tree_nodes_and_experts_woken(engine):
    _, prefix, suffix = code_prompts(1, seed=41, before=300)[0]
    result = engine.complete(prefix, suffix, strategy="hybrid", max_tokens=6, mode="multi", use_prompt_cache=False)
    cfg = engine.target.config
    passes = result.stats.target_passes
    assert result.stats.tree_nodes >= passes  # each pass verifies its root at least
    assert passes * len(cfg.sparse_layers) <= result.stats.experts_woken <= passes * len(cfg.sparse_layers) * cfg.num_experts


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


def test_a_spike_in_the_measured_verify_costs_stays_where_it_was():
    """Measured on a busy machine, 2 tree tokens once took two steps: that must not price every
    larger tree at two steps too (the server would then never speculate)."""
    from specdec.decode.budget import SIZES, VerifyCost, grow_tree, non_decreasing_from_the_right
    from specdec.decode.tree import TokenTree

    measured = [7.6, 14.9, 7.9, 8.1, 8.4, 8.8, 9.5, 10.2, 12.0, 13.5]
    fitted = non_decreasing_from_the_right(measured)
    assert fitted[:3] == [7.6, 7.9, 7.9] and fitted[3:] == measured[3:]
    assert all(a <= b for a, b in zip(fitted, fitted[1:], strict=False))
    tree = TokenTree(0)
    grow_tree(tree, [DraftPath("draft", [1, 2, 3, 4], [0.9, 0.8, 0.7, 0.6])], VerifyCost(SIZES, fitted), 64)
    assert len(tree) == 5  # likely tokens are worth their (small) marginal cost


def test_served_forwards_correct_the_measured_verify_costs():
    """A start-up loop understates what a tree costs in service; served forwards move each size
    bucket's ratio, and a bucket not yet served adds its measured growth to the nearest smaller
    one served (its extra cost, not its ratio: large trees must stay worth trying)."""
    from specdec.decode.budget import SIZES, VerifyCost, min_useful_prob

    measured = [2.0, 2.4, 3.0, 4.0, 4.8, 5.6, 7.0, 8.5, 11.0, 14.0]
    cost = VerifyCost(SIZES, measured)
    assert cost(2) == 2.4 and cost.ratios == [None] * len(SIZES)
    for _ in range(200):
        cost.observe(1, 2.0)  # plain steps cost what was measured
        cost.observe(2, 4.0)  # two tokens cost twice a step in service
        cost.observe(3, 5.4)  # the 2-4 bucket learns from a 3-token tree too (measured 2.7)
    assert abs(cost(1) - 2.0) < 0.01
    assert 2.4 * 1.7 < cost(2) < 2.4 * 2.0  # the bucket's ratio lies between n=2's 1.67 and n=3's 2.0
    extra = cost(2) - 2.4  # what the 2-4 bucket pays in service over its measurement
    assert abs(cost(4) - (3.0 + extra)) < 1e-6 and abs(cost(64) - (14.0 + extra)) < 1e-6
    assert all(a <= b for a, b in zip(cost.millis, cost.millis[1:], strict=False))
    assert min_useful_prob(cost) > 0.6  # a second token must now be likely to pay its cost
    cost.observe(1, 1000.0)  # one stalled step moves the estimate by RATE, not to the stall
    assert 2.0 < cost(1) < 2.0 + VerifyCost.RATE * 1000 + 0.01
    cost.observe(96, 42.0)  # past the largest size: its bucket, at the last size's per-token cost (21 ms)
    assert cost.ratios[-1] == 2.0


def test_a_tree_is_kept_at_the_size_that_pays_best_not_cut_at_the_first_costly_node():
    """In service the first extra token costs the most (it wakes other experts): a likely long
    chain must be built whole, although its first node alone does not pay; an unlikely one not."""
    from specdec.decode.budget import SIZES, VerifyCost, grow_tree
    from specdec.decode.tree import TokenTree

    served = VerifyCost(SIZES, [2.0, 4.0, 4.3, 4.6, 4.9, 5.2, 6.0, 7.0, 9.0, 11.0])
    likely = [0.8 * 0.97**k for k in range(12)]
    tree = TokenTree(0)
    grow_tree(tree, [DraftPath("suggestion", list(range(1, 13)), likely)], served, 64)
    assert len(tree) == 13 and tree.depths[-1] == 12 and tree.children[0] == {1: 1}
    tree = TokenTree(0)
    grow_tree(tree, [DraftPath("history", [1, 2, 3], [0.3, 0.1, 0.03]),
                     DraftPath("trie", [7, 8], [0.2, 0.05])], served, 64)
    assert len(tree) == 1 and tree.children == [{}]  # nothing pays: plain decoding
    tree = TokenTree(0)
    grow_tree(tree, [DraftPath("history", [1, 2, 3], [0.3, 0.1, 0.03])], served, 64, force=True)
    assert len(tree) == 4  # forced: every node


def _grown_path_by_path(paths, cost, max_nodes, force):
    """The reference tree growth: each best node inserted as its whole path prefix from the root."""
    import heapq

    from specdec.decode.tree import TokenTree

    tree = TokenTree(0)
    heap = [(-p.probs[0], i, 0) for i, p in enumerate(paths) if p.tokens]
    heapq.heapify(heap)
    expected, best_rate, best_size = 0.0, 1.0 / cost(1), 1
    while heap and len(tree) < max_nodes:
        neg_p, i, depth = heapq.heappop(heap)
        node, added = 0, False
        for token, prob in zip(paths[i].tokens[: depth + 1], paths[i].probs[: depth + 1], strict=True):
            child = tree.children[node].get(token)
            if child is None:
                if len(tree) >= max_nodes:
                    break
                child, added = tree.add_child(node, token, paths[i].source, prob), True
            else:
                tree.probs[child] = max(tree.probs[child], prob)
            node = child
        if added:
            expected -= neg_p
            if (expected + 1.0) / cost(len(tree)) > best_rate:
                best_rate, best_size = (expected + 1.0) / cost(len(tree)), len(tree)
        if depth + 1 < len(paths[i].tokens):
            heapq.heappush(heap, (-paths[i].probs[depth + 1], i, depth + 1))
    if not force:
        tree.truncate(best_size)
    return tree


def test_growing_a_tree_node_by_node_builds_the_tree_path_by_path_insertion_builds():
    """grow_tree places each node under the node its path reached; the tree (tokens, parents,
    sources, probabilities) and its cut must be those of inserting each path prefix from the root,
    on overlapping paths of every source, under budgets that cut them."""
    import random

    from specdec.decode.budget import SIZES, VerifyCost, grow_tree
    from specdec.decode.tree import TokenTree

    rng = random.Random(7)
    cost = VerifyCost(SIZES, [2.0, 2.3, 2.8, 3.5, 4.2, 4.9, 6.0, 7.4, 9.8, 12.5])
    for case in range(200):
        paths = []
        for _ in range(rng.randint(1, 6)):
            length = rng.randint(0, 40)
            tokens = [rng.randint(1, 4) for _ in range(length)]  # few token ids: paths share prefixes
            p, probs = rng.uniform(0.2, 1.0), []
            for _ in tokens:
                probs.append(p)
                p *= rng.uniform(0.5, 1.5)  # not always falling: a shared node keeps its best probability
            paths.append(DraftPath(rng.choice(["trie", "draft", "history"]), tokens, probs))
        budget, force = rng.choice([2, 5, 16, 64]), case % 2 == 0
        grown = TokenTree(0)
        grow_tree(grown, paths, cost, budget, force)
        reference = _grown_path_by_path(paths, cost, budget, force)
        assert (grown.tokens, grown.parents, grown.sources, grown.probs) == \
            (reference.tokens, reference.parents, reference.sources, reference.probs), case
        assert grown.children == reference.children
    shared = [DraftPath("trie", [1, 2], [0.5, 0.9]), DraftPath("draft", [1, 2], [0.4, 0.95])]
    grown = TokenTree(0)
    grow_tree(grown, shared, cost, 64, force=True)
    assert grown.probs == [1.0, 0.5, 0.95]  # a node reached again keeps the best probability offered
    cost.observe(1, 2.0)  # a served forward: the cost table is rebuilt when next read
    grow_tree(TokenTree(0), [DraftPath("history", [1, 2, 3], [0.9, 0.8, 0.7])], cost, 64)
    assert len(cost.table(0)) == 5  # costs of 0..4 nodes, all three tokens can make: not the budget's 65


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


def test_a_tree_riding_with_other_requests_is_priced_at_what_it_adds_to_their_step():
    """Where other requests' tokens have woken the experts, a tree's tokens add little to the
    step: nodes that do not pay alone pay there, and the draft's floor falls."""
    from specdec.decode.budget import SIZES, VerifyCost, grow_tree, min_useful_prob
    from specdec.decode.tree import TokenTree

    # alone, the second token costs 60% of a step; among 4 requests' tokens, about 10% of their step
    cost = VerifyCost(SIZES, [2.0, 3.2, 4.2, 5.0, 5.4, 5.8, 6.6, 7.4, 9.0, 10.6])
    unlikely = [DraftPath("trie", [1, 2, 3], [0.3, 0.25, 0.2])]
    alone, batched = TokenTree(0), TokenTree(0)
    grow_tree(alone, unlikely, cost, 64)
    grow_tree(batched, unlikely, cost, 64, riding=3)
    assert len(alone) == 1 and len(batched) == 4
    assert min_useful_prob(cost) > 0.5 > 0.3 > min_useful_prob(cost, riding=3)


def test_batched_steps_learn_their_speeds_apart_from_lone_steps():
    from specdec.decode.policy import SpeculationPolicy, speed_key

    policy = SpeculationPolicy()
    for _ in range(5):
        policy.record_step(speed_key("hybrid", False), True, 3.0, 1)  # alone, a tree costs more than it brings
        policy.record_step(speed_key("hybrid", False), False, 1.5, 1)
        policy.record_step(speed_key("hybrid", True), True, 2.0, 2)  # in a batch it pays
        policy.record_step(speed_key("hybrid", True), False, 1.8, 1)
    assert set(policy.step_speed) == {"hybrid", "hybrid batched"}
    assert policy.step_speed["hybrid"]["spec"] > policy.step_speed["hybrid"]["plain"]
    assert policy.step_speed["hybrid batched"]["spec"] < policy.step_speed["hybrid batched"]["plain"]


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
