"""What speculation is worth, learned per document: acceptance of each source and the speed of
speculative against plain steps. For a strategy with a draft model or head, a "spec" step is one
the draft drafted for and a "plain" one has the lookups' tree alone (proposing._draft_decision).

Each document (an editor buffer) has its own SpeculationPolicy, so that one user's code does not
price another's tree. A document seen for the first time starts from the global prior, which
every update also moves (more slowly), so a new document starts from what the engine has learned
so far. Documents live in an LRU of bounded size.
"""

import copy
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

GLOBAL_RATE_SHARE = 0.25  # the prior learns at this fraction of a document's rate


@dataclass
class AcceptanceStats:
    """Running estimates of how often each source's tokens are accepted, to price tree nodes."""

    first: dict = field(default_factory=lambda: {"trie": 0.5, "ngram": 0.4, "history": 0.6,
                                                 "suggestion": 0.8})  # P(first accepted)
    next: dict = field(default_factory=lambda: {"trie": 0.8, "ngram": 0.6, "history": 0.9,
                                                "suggestion": 0.95})  # P(next | previous)
    draft_scale: float = 0.9  # the draft's own probability, scaled by how calibrated it proved

    def update_draft(self, predicted: float, accepted: int, rate=0.05) -> None:
        """Calibrate the draft's probabilities: accepted draft tokens against their predicted sum."""
        if predicted > 0:
            ratio = min(1.5, accepted / predicted)
            self.draft_scale += rate * (ratio * self.draft_scale - self.draft_scale)
            self.draft_scale = min(1.0, max(0.05, self.draft_scale))

    def update(self, source: str, proposed_depth: int, accepted_depth: int, rate=0.05) -> None:
        if source not in self.first or proposed_depth == 0:
            return
        self.first[source] += rate * ((accepted_depth > 0) - self.first[source])
        if accepted_depth > 0 and proposed_depth > 1:
            tried = min(proposed_depth - 1, accepted_depth)
            got = accepted_depth - 1
            self.next[source] += rate * (got / max(1, tried) - self.next[source])

    def chain_probs(self, source: str, length: int, rank: int) -> list[float]:
        p = self.first[source] / (1 + rank)
        out = []
        for _ in range(length):
            out.append(p)
            p *= self.next[source]
        return out


@dataclass
class SpeculationPolicy:
    """Acceptance estimates and step speeds (ms per generated token) per strategy."""

    acceptance: AcceptanceStats = field(default_factory=AcceptanceStats)
    step_speed: dict = field(default_factory=dict)  # strategy -> {"spec": ms, "plain": ms}
    steps: dict = field(default_factory=dict)  # strategy -> steps recorded
    samples: dict = field(default_factory=dict)  # strategy -> {"spec": steps, "plain": steps}
    slower_at: dict = field(default_factory=dict)  # strategy -> its step count at its last step of the slower kind
    means: dict = field(default_factory=dict)  # strategy -> {kind: (mean ms, mean tokens) of its steps}

    # Steps of each kind measured before either may be given up: step times vary with the
    # context and the tree, so one slow first speculating step (which once stood for the whole
    # document) says little. Until then the kinds alternate.
    MIN_SAMPLES = 8
    # At least this many steps per step of the slower kind, which keeps its estimate current,
    # and at most this share of the time lost to exploring. Where speculation does not pay,
    # exploring is most of what a strategy loses against plain decoding, so the share is small;
    # where the two kinds run close, exploring is cheap and frequent, so a noisy estimate that
    # put the faster kind behind is soon corrected.
    EXPLORE_EVERY = 8
    EXPLORE_COST = 0.005
    # A step's time counts at most this many times its kind's estimate. The faster kind is
    # measured at every step but the slower one only when explored: one plain step stalled
    # tenfold (a collection, the OS) would make plain decoding look slower than drafting, and
    # the few explorations of plain steps would take hundreds of steps to undo it.
    OUTLIER_CAP = 3.0

    def should_speculate(self, strategy: str) -> bool:
        """Speculate where it is measured faster (a pure question: recording a step moves the state)."""
        counts = self.samples.get(strategy, {})
        spec_steps, plain_steps = counts.get("spec", 0), counts.get("plain", 0)
        if min(spec_steps, plain_steps) < self.MIN_SAMPLES:
            return spec_steps <= plain_steps
        speeds = self.step_speed[strategy]
        faster = speeds["spec"] < speeds["plain"]
        interval = self.explore_interval(strategy)
        # Counted from the slower kind's last step, not as steps modulo the interval: the
        # interval moves with every measured step, and a moving modulus skipped explorations.
        explore = self.steps.get(strategy, 0) - self.slower_at.get(strategy, 0) >= interval - 1
        return not faster if explore else faster

    def explore_interval(self, strategy: str) -> int:
        """Steps per exploring step: a step of the slower kind costs (slower / faster - 1) of a
        step, so the further apart the kinds were measured, the rarer the exploration (a draft
        measured twice as slow as plain decoding is tried once in 200 steps, one 4% slower once
        in 8)."""
        speeds = self.step_speed.get(strategy, {})
        spec, plain = speeds.get("spec"), speeds.get("plain")
        if not spec or not plain:
            return self.EXPLORE_EVERY
        gap = max(spec, plain) / min(spec, plain) - 1.0
        return max(self.EXPLORE_EVERY, math.ceil(gap / self.EXPLORE_COST))

    def record_step(self, strategy: str, speculative: bool, millis: float, tokens: int, rate: float = 0.1) -> None:
        """A step's milliseconds and tokens into its kind's averages, whose ratio is the kind's
        milliseconds per token. The ratio of averages, not the average of each step's ratio: a
        tree that took 3 tokens in 39 ms and one that took 1 in 33 ms made 18 ms a token, where
        the mean of 13 and 33 said 23, slower than a plain step's 22 (speculation judged slower
        where it was faster). Each average is the plain mean while there are fewer than 1 / rate
        steps (a first step must not weigh as much as the next ten together), then a moving one."""
        if tokens <= 0:
            return
        self.steps[strategy] = self.steps.get(strategy, 0) + 1
        speeds = self.step_speed.setdefault(strategy, {})
        if len(speeds) == 2 and (speeds["spec"] < speeds["plain"]) != speculative:
            self.slower_at[strategy] = self.steps[strategy]
        counts = self.samples.setdefault(strategy, {})
        means = self.means.setdefault(strategy, {})
        kind = "spec" if speculative else "plain"
        counts[kind] = counts.get(kind, 0) + 1
        if kind not in means:
            means[kind] = (float(millis), float(tokens))
        else:  # one stalled step (a collection, the OS) must not reverse the decision
            millis = min(millis, self.OUTLIER_CAP * speeds[kind] * tokens)
            weight = max(rate, 1.0 / counts[kind])
            mean_ms, mean_tokens = means[kind]
            means[kind] = (mean_ms + weight * (millis - mean_ms), mean_tokens + weight * (tokens - mean_tokens))
        speeds[kind] = means[kind][0] / means[kind][1]


class PolicyPair(NamedTuple):
    """What a request learns into: its document's policy and the global prior (the same object
    for a request without a document)."""

    document: SpeculationPolicy
    prior: SpeculationPolicy


class PolicyBook:
    """SpeculationPolicy per document, in an LRU, each starting from the global prior."""

    def __init__(self, max_documents: int = 256):
        self.prior = SpeculationPolicy()
        self.max_documents = max_documents
        self._documents: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def for_document(self, document: str | None) -> SpeculationPolicy:
        if document is None:
            return self.prior
        with self._lock:
            policy = self._documents.get(document)
            if policy is None:
                policy = self._documents[document] = copy.deepcopy(self.prior)
                while len(self._documents) > self.max_documents:
                    self._documents.popitem(last=False)
            self._documents.move_to_end(document)
            return policy

    def __len__(self) -> int:
        return len(self._documents)


def speed_key(strategy: str, batched: bool) -> str:
    """Where a strategy's step speeds are kept: a step batched with other requests apart from a
    lone one. In a batch the other requests' tokens have woken most experts, so a tree costs the
    step less; one estimate for both would mix the two, by whatever share of steps ran batched."""
    return f"{strategy} batched" if batched else strategy


def learn_acceptance(policies, source: str, proposed_depth: int, accepted_depth: int, rate: float = 0.05) -> None:
    """One source's outcome in a step, into a document's policy and (more slowly) the prior."""
    for policy, share in _with_shares(policies):
        policy.acceptance.update(source, proposed_depth, accepted_depth, rate * share)


def learn_draft(policies, predicted: float, accepted: int, rate: float = 0.05) -> None:
    for policy, share in _with_shares(policies):
        policy.acceptance.update_draft(predicted, accepted, rate * share)


def learn_step(policies, strategy: str, speculative: bool, millis: float, tokens: int) -> None:
    for policy, share in _with_shares(policies):
        policy.record_step(strategy, speculative, millis, tokens, 0.1 * share)


def _with_shares(policies: PolicyPair):
    """(document policy, 1.0) and (prior, GLOBAL_RATE_SHARE); one pair when they are the same."""
    document, prior = policies.document, policies.prior
    if document is prior:
        return ((prior, 1.0),)
    return ((document, 1.0), (prior, GLOBAL_RATE_SHARE))
