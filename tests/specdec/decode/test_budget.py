"""Verify costs and tree growth."""

from specdec.decode.drafting import DraftPath


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
