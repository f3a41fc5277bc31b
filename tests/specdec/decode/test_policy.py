"""Speculation policies: per document, and batched steps apart."""

from specdec.decode.policy import PolicyBook


def test_each_document_prices_its_own_trees():
    book = PolicyBook(max_documents=2)
    a, b = book.for_document("a.py"), book.for_document("b.py")
    a.acceptance.update("trie", 4, 0, rate=0.5)  # a.py's trie proposals all rejected
    assert a.acceptance.first["trie"] < b.acceptance.first["trie"] == book.prior.acceptance.first["trie"]
    book.for_document("c.py")  # evicts the least recently used (a.py)
    assert len(book) == 2 and book.for_document("a.py").acceptance.first["trie"] == book.prior.acceptance.first["trie"]


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
