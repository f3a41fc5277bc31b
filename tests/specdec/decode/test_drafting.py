"""The draft model's chain and its branches: every depth's runner-ups, with their probabilities."""

import pytest
import torch

from specdec.decode.drafting import DraftPath, DraftRunner, EagleRunner, branch_paths, cut_after, ngram_paths
from specdec.decode.policy import AcceptanceStats
from specdec.models.loader import load_model


def test_branches_leave_the_chain_at_their_depth():
    tokens, probs = [5, 6, 7], [0.9, 0.6, 0.3]
    alternatives = [[(8, 0.05)], [], [(9, 0.2), (10, 0.1)], [(11, 0.02)]]
    assert branch_paths(tokens, probs, alternatives) == [
        ([8], [0.05]), ([5, 6, 9], [0.9, 0.6, 0.2]), ([5, 6, 10], [0.9, 0.6, 0.1]), ([5, 6, 7, 11], [0.9, 0.6, 0.3, 0.02])]


def test_a_path_is_cut_after_its_first_ending_token():
    path = DraftPath("history", [4, 7, 9, 7, 2], [0.9, 0.8, 0.7, 0.6, 0.5])
    assert cut_after(path, {7}) == DraftPath("history", [4, 7], [0.9, 0.8])
    assert cut_after(path, {1}) is path


def test_newline_tokens_are_those_whose_text_holds_one(tiny_models):
    from specdec.prompt.fim import PromptBuilder

    prompts = PromptBuilder(load_model(tiny_models[0]).tokenizer)
    ids = prompts.encode("x = 1\n    y = 2\n\n")
    assert {t for t in ids if "\n" in prompts.vocab_text[t]} <= prompts.newline_ids
    assert prompts.newline_ids and all("\n" in prompts.vocab_text[t] for t in prompts.newline_ids)
    assert prompts.encode("x")[0] not in prompts.newline_ids


@torch.inference_mode()
def test_runner_ups_at_every_depth_are_the_drafts_own_distribution(tiny_models):
    draft = load_model(tiny_models[1])
    committed = draft.tokenizer.encode("def add(a, b):\n    return a").ids
    runner = DraftRunner(draft)
    runner.sync(committed)
    tokens, probs = runner.chain(committed, max_depth=4, min_prob=0.0)
    assert len(tokens) == 4 and len(runner.alternatives) == 4
    before = 1.0
    for depth, found in enumerate(runner.alternatives):
        dist = torch.softmax(draft.logits(torch.tensor([committed + tokens[:depth]]))[0, -1], -1)
        top = torch.topk(dist, 3)
        assert [t for t, _ in found] == [t for t in top.indices.tolist() if t != tokens[depth]]
        for token, prob in found:
            assert prob == pytest.approx(before * float(dist[token]), rel=1e-4)
        before *= float(dist[tokens[depth]])
        assert probs[depth] == pytest.approx(before, rel=1e-4)


def test_common_prefix_stops_at_the_first_difference():
    from specdec.decode.drafting import common_prefix

    assert common_prefix([1, 2, 3], [1, 2, 9, 3]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([5], [1]) == 0


def test_common_prefix_of_token_lists_matches_a_plain_scan():
    """The draft's cache is rewound to the common prefix of its tokens and the committed ones,
    found by comparing slices; it must equal a token-by-token scan, wherever the lists part."""
    import random

    from specdec.decode.drafting import common_prefix

    rng = random.Random(3)
    for _ in range(3000):
        a = [rng.randint(0, 2) for _ in range(rng.randint(0, 40))]
        b = a[: rng.randint(0, len(a))] + [rng.randint(0, 2) for _ in range(rng.randint(0, 12))]
        scan = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == common_prefix(b, a) == scan


def test_a_cold_request_feeds_the_draft_its_prompt_only_when_it_drafts(tiny_models):
    """A request a user waits on syncs the draft's cache when a step first drafts: one that
    decodes plainly feeds the draft nothing, one that drafts feeds it the prompt once and gives
    the target's own tokens; a warming request (max_tokens 0) syncs it at once."""
    from specdec import Engine
    from tests.helpers import code_prompts

    engine = Engine(load_model(tiny_models[0]), load_model(tiny_models[1]))
    fed = []
    original = engine.draft.forward
    engine.draft.forward = lambda ids, *args, **kwargs: fed.append(len(ids)) or original(ids, *args, **kwargs)
    (_, prefix, suffix), (_, other, other_suffix) = code_prompts(2, seed=31, before=600, after=100)
    prior = engine.policies.prior
    for _ in range(prior.MIN_SAMPLES):  # drafting measured far slower, and as often as needed: plain steps
        prior.record_step("draft", True, 50.0, 1)
        prior.record_step("draft", False, 1.0, 1)
    reference = engine.complete(prefix, suffix, strategy="ar", max_tokens=6, use_prompt_cache=False)
    plain = engine.complete(prefix, suffix, strategy="draft", max_tokens=6, use_prompt_cache=False)
    assert plain.tokens == reference.tokens and fed == []
    forced = Engine(engine.target, engine.draft, adaptive=False)
    fed.clear()  # its start-up measured the draft
    drafted = forced.complete(prefix, suffix, strategy="draft", max_tokens=6, use_prompt_cache=False)
    assert drafted.tokens == reference.tokens and drafted.stats["tree_nodes"] > 0
    assert max(fed) == len(forced.prompt_for(prefix, suffix).ids) - 1  # the prompt, once
    fed.clear()
    forced.complete(other, other_suffix, strategy="draft", max_tokens=0)
    assert sum(fed) == len(forced.prompt_for(other, other_suffix).ids) - 1


def _head_and_prompt_features(tmp_path, tiny_models):
    from specdec import Segment
    from specdec.models.eagle import load_eagle3
    from tests.specdec.models.test_eagle import _write_head

    target = load_model(tiny_models[0])
    _write_head(tmp_path / "head", target)
    head = load_eagle3(tmp_path / "head", target)
    target.capture_layers = head.config.capture_layers(target.config.num_layers)
    ids = target.tokenizer.encode("def area(w, h):\n    return w * h\n\nprint(area(2, 3))\n").ids
    n = len(ids)
    features = target.run(torch.tensor(ids), torch.arange(n), [Segment(target.new_cache(n), n)]).captured
    return head, ids, features


def _counting_advance(head, fed: list):
    original = head.advance
    head.advance = lambda tokens, *args, **kwargs: fed.append(len(tokens)) or original(tokens, *args, **kwargs)


def test_a_head_synced_chunk_by_chunk_drafts_as_one_caught_up_in_its_chain(tmp_path, tiny_models):
    """sync() feeds all pairs but the last, as a prefill's chunks arrive; chain() then feeds one
    row and drafts what a cold runner drafts, which feeds the whole prompt in its chain's first
    forward (one forward: the head's fixed cost per forward is paid once)."""
    head, ids, features = _head_and_prompt_features(tmp_path, tiny_models)
    cold, fed = EagleRunner(head, features.clone()), []
    _counting_advance(head, fed)
    try:
        expected, expected_probs = cold.chain(ids, 4, 0.0)
        assert fed == [len(ids) - 1, 1, 1, 1]
        synced = EagleRunner(head)
        for start in range(0, len(ids), 5):  # the prompt's chunks, features arriving with them
            synced.extend(features[start : start + 5])
            synced.sync(ids)
            assert synced.synced == min(start + 5, len(ids) - 1) - 1 and synced.cache.length == synced.synced
        fed.clear()
        tokens, probs = synced.chain(ids, 4, 0.0)
    finally:
        del head.advance
    assert tokens == expected and len(tokens) == 4 and probs == pytest.approx(expected_probs, abs=1e-5)
    assert fed == [1, 1, 1, 1] and synced.synced == cold.synced == len(ids) - 1
    again, _ = synced.chain(ids, 4, 0.0)  # nothing new: the last pair is fed again, not skipped
    assert again == expected


def test_draft_paths_are_typed():
    paths = ngram_paths([1, 2, 3, 9, 1, 2, 3], AcceptanceStats())
    assert paths and all(isinstance(p, DraftPath) for p in paths)
    assert paths[0].source == "ngram" and paths[0].tokens[0] == 9 and len(paths[0].probs) == len(paths[0].tokens)


def test_a_heads_drafting_step_is_timed_and_prices_its_tokens(tmp_path, tiny_models, monkeypatch):
    """warm_up measures a head's step (it used to assume a tenth of a target step) and its ratio
    to a target step becomes the head's draft floor."""
    import specdec.engine
    from specdec import Engine
    from specdec.decode.drafting import head_step_millis

    head, _ids, _features = _head_and_prompt_features(tmp_path, tiny_models)
    millis = head_step_millis(head, context=16, repeats=3)
    assert 0.0 < millis < 1000.0
    engine = Engine(head_target := load_model(tiny_models[0]), head=head, warm_up=False)
    engine.warm_up()
    assert 0.05 <= engine.draft_min_prob <= 0.5
    fresh = Engine(head_target, head=head, warm_up=False)
    fresh.verify_cost = engine.verify_cost
    monkeypatch.setattr(specdec.engine, "head_step_millis", lambda h: 0.3 * engine.verify_cost(1))
    fresh.warm_up()
    assert fresh.draft_min_prob == pytest.approx(0.3)


@torch.inference_mode()
def test_a_chain_keeps_a_paid_token_down_to_its_node_price_without_drafting_further(tmp_path, tiny_models):
    """A token whose forward is paid is kept while its chance is above keep_prob (its tree
    node's price); another forward runs only above min_prob. A floor of 1.0 alone keeps nothing."""
    draft = load_model(tiny_models[1])
    committed = draft.tokenizer.encode("def add(a, b):\n    return a").ids
    forwards, original = [], draft.forward
    draft.forward = lambda *args, **kwargs: forwards.append(1) or original(*args, **kwargs)
    try:
        assert DraftRunner(draft).chain(committed, 4, min_prob=1.0) == ([], [])
        forwards.clear()
        tokens, probs = DraftRunner(draft).chain(committed, 4, min_prob=1.0, keep_prob=0.0)
    finally:
        del draft.forward
    assert len(tokens) == 1 and len(forwards) == 1 and 0.0 < probs[0] < 1.0
    longer, _ = DraftRunner(draft).chain(committed, 4, min_prob=0.0)
    assert longer[0] == tokens[0] and len(longer) == 4

    head, ids, features = _head_and_prompt_features(tmp_path, tiny_models)
    assert EagleRunner(head, features.clone()).chain(ids, 4, 1.0) == ([], [])
    fed = []
    _counting_advance(head, fed)
    try:
        tokens, probs = EagleRunner(head, features.clone()).chain(ids, 4, 1.0, keep_prob=0.0)
    finally:
        del head.advance
    assert len(tokens) == 1 and fed == [len(ids) - 1]
    assert tokens[0] == EagleRunner(head, features.clone()).chain(ids, 4, 0.0)[0][0]
