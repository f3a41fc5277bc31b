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


def test_one_slow_first_speculating_step_does_not_end_speculation():
    """Both kinds are measured MIN_SAMPLES times, alternating, before the slower is given up:
    a first speculating step that paid a one-off cost once stood for the whole document."""
    from specdec.decode.policy import SpeculationPolicy

    policy = SpeculationPolicy()
    decisions = []
    for step in range(2 * policy.MIN_SAMPLES):
        decisions.append(policy.should_speculate("hybrid"))
        millis = (45.0 if step == 0 else 20.0) if decisions[-1] else 25.0  # the first tree paid a catch-up
        policy.record_step("hybrid", decisions[-1], millis, 1)
    assert decisions == [True, False] * policy.MIN_SAMPLES
    assert policy.step_speed["hybrid"]["spec"] < policy.step_speed["hybrid"]["plain"]
    assert policy.should_speculate("hybrid")


def test_the_first_steps_are_averaged_not_the_first_one_kept():
    from specdec.decode.policy import SpeculationPolicy

    policy = SpeculationPolicy()
    for millis in (30.0, 10.0, 20.0):
        policy.record_step("hybrid", True, millis, 1, rate=0.1)
    assert abs(policy.step_speed["hybrid"]["spec"] - 20.0) < 1e-9
    for _ in range(200):  # then a moving average: a lasting change is followed
        policy.record_step("hybrid", True, 40.0, 1, rate=0.1)
    assert policy.step_speed["hybrid"]["spec"] > 39.0


def test_a_slower_kind_is_explored_once_per_interval_after_measurement():
    from specdec.decode.policy import SpeculationPolicy

    policy = SpeculationPolicy()
    for _ in range(policy.MIN_SAMPLES):
        policy.record_step("hybrid", True, 40.0, 1)
        policy.record_step("hybrid", False, 20.0, 1)
    interval = policy.explore_interval("hybrid")
    assert interval == 200  # twice as slow
    decisions = []
    for _ in range(2 * interval):
        decisions.append(policy.should_speculate("hybrid"))
        policy.record_step("hybrid", decisions[-1], 40.0 if decisions[-1] else 20.0, 1)
    assert decisions.count(True) == 2


def test_speed_is_the_time_per_token_over_steps_not_the_mean_of_each_steps_rate():
    from specdec.decode.policy import SpeculationPolicy

    policy = SpeculationPolicy()
    policy.record_step("hybrid", True, 39.0, 3)  # a tree that took 3 tokens
    policy.record_step("hybrid", True, 33.0, 1)  # one that took only the bonus token
    assert abs(policy.step_speed["hybrid"]["spec"] - 18.0) < 1e-9  # 72 ms for 4 tokens, not (13 + 33) / 2
