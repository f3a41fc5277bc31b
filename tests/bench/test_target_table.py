"""The target-table bench's table and tallies on inputs whose answers are known."""

from bench.target_table import ChoiceTable, agreement_by_bucket


def test_the_longest_context_seen_decides_and_its_share_is_the_confidence():
    table = ChoiceTable()
    # after 7 the target chose 3 twice and 1 twice; after (5, 7) it chose 3 both times
    table.add([5, 7, 9, 7], [0, 3, 0, 1])
    table.add([5, 7], [0, 3])
    table.add([8, 7], [0, 1])
    assert table.lookup([4, 5, 7]) == (3, 1.0)  # (5, 7) known: its choice, not the backoff's
    token, share = table.lookup([6, 7])  # only (7,) known: 3, 3, 1, 1 after it
    assert token in (1, 3) and share == 0.5
    assert table.lookup([8, 7]) == (1, 1.0)
    assert table.lookup([42]) is None


def test_a_context_longer_than_the_orders_is_cut_to_its_tail():
    table = ChoiceTable()
    table.add([1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 9, 0])
    assert table.lookup([99, 98, 2, 3, 4, 5]) == (9, 1.0)


def test_buckets_split_by_confidence_and_leave_unknown_contexts_out():
    rows = [(0.95, True), (0.95, False), (0.6, True), (-1.0, False)]
    report = agreement_by_bucket(rows)
    assert report["positions"] == 4 and report["agreement"] == 0.5
    by_low = {b["confidence"][0]: b for b in report["buckets"]}
    assert by_low[0.9]["share"] == 0.5 and by_low[0.9]["agreement"] == 0.5
    assert by_low[0.5]["agreement"] == 1.0
    assert by_low[0.0]["share"] == 0.0 and by_low[0.0]["agreement"] is None
