"""How many tree nodes a verify pass should carry, from measured costs and expected acceptance.

The target's verify cost for n tree tokens is measured once per model and device (a few
forwards at each size, median) and corrected by the forwards it serves. A tree is grown
best-first by the estimated probability that the target accepts each node's path, and cut to
the size n with the most expected tokens per millisecond, (E(n) + 1) / cost(n), E(n) being the
expected accepted tokens of its first n nodes (the +1 is the bonus token every pass yields).
"""

import bisect
import heapq
import statistics
import threading
import time

import torch

from specdec.models.model import Segment

SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)


class VerifyCost:
    """Milliseconds of one target forward with n new tokens over a cached prefix: the shape
    measured at start-up, corrected by the forwards the engine actually runs.

    A start-up loop keeps the weights it reads in the CPU's cache; in service each step's tokens
    wake other experts, read from memory, and the draft and the caches evict them between steps.
    So served verify passes cost more than the start-up loop measured, and trees priced by it
    alone were built that did not pay. Each served forward's time, over the measured cost of its size,
    moves a running ratio for its size bucket (sizes below the next measured size). A bucket not
    yet served adds the measured cost's growth to the nearest smaller bucket served: the extra a
    served tree pays is mostly the experts it wakes, and a larger tree wakes few more once every
    expert is awake, so scaling its whole cost by a small tree's ratio would price large trees
    out before one was ever tried, and the estimate could never learn otherwise."""

    RATE = 0.05  # the weight of one served forward in its bucket's ratio

    def __init__(self, sizes, millis):
        self.sizes, self.measured = list(sizes), list(millis)
        self.ratios: list[float | None] = [None] * len(self.sizes)
        self._millis: list | None = list(millis)  # the corrected curve; None: recompute when read
        self._table: list = []  # cost(n) for n = 0, 1, ...: read by every speculating step
        self.lock = threading.Lock()
        # (bucket, measured cost) of each size up to the largest measured: every served forward
        # is observed, and two searches and an interpolation cost more than the rest of it.
        self._observed_at = [self._bucket_and_measured(n) for n in range(self.sizes[-1] + 1)]

    @classmethod
    def measure(cls, model, context: int = 512, repeats: int = 5, sample_ids=None) -> "VerifyCost":
        """sample_ids: real code tokens. An MoE's cost depends on how many experts the tokens
        wake, and identical (e.g. zero) ids all route alike, which understates a real tree; each
        repeat takes other tokens, as served steps do.

        The sizes are timed in interleaved rounds and each keeps its median: a slow spell of
        the machine then slows every size alike, where timing one size's repeats back to back
        let it land on one size. The curve is then made non-decreasing from the right, cost(n)
        = min over m >= n: a spike at one small size must not raise every larger size with it,
        which made a server started on a busy machine price every tree token at a whole step
        and never speculate."""
        need = context + max(SIZES) * repeats
        ids = torch.as_tensor(list(sample_ids or ()) or [0], dtype=torch.long)
        ids = ids.repeat(need // len(ids) + 1)[:need]
        cache = model.new_cache(context + max(SIZES))
        model(ids[:context], torch.arange(context), [Segment(cache, context)])
        cache.keep_all()
        times = {n: [] for n in SIZES}
        for r in range(repeats):
            new = ids[context + r * max(SIZES) :]
            for n in SIZES:
                started = time.perf_counter()
                model(new[:n], torch.arange(context, context + n), [Segment(cache, n)])
                times[n].append((time.perf_counter() - started) * 1000)
        return cls(SIZES, non_decreasing_from_the_right([statistics.median(times[n]) for n in SIZES]))

    def __call__(self, n: int) -> float:
        return interpolate(self.sizes, self.millis, n)

    @property
    def millis(self) -> list:
        """The corrected cost of each measured size. Every served step moves the ratios and only
        speculating steps read the curve, so it is recomputed when read, not when observed."""
        millis = self._millis
        if millis is None:
            with self.lock:
                millis = self._millis = self._corrected()
        return millis

    def table(self, largest: int) -> list:
        """[cost(0), cost(1), ..., cost(largest)]: one list lookup per tree node where the
        interpolation would search the sizes again (kept until the next observed forward)."""
        table = self._table
        if len(table) <= largest:
            sizes, millis = self.sizes, self.millis
            table = self._table = [interpolate(sizes, millis, n) for n in range(largest + 1)]
        return table

    def observe(self, n: int, millis: float) -> None:
        """One served forward of n tokens (a single request's tree, nothing else in it) took `millis`."""
        i, measured = self._observed_at[n] if n < len(self._observed_at) else self._bucket_and_measured(n)
        ratio = millis / measured
        with self.lock:
            old = self.ratios[i]
            self.ratios[i] = ratio if old is None else old + self.RATE * (ratio - old)
            self._millis, self._table = None, []

    def _bucket_and_measured(self, n: int) -> tuple:
        return max(0, bisect.bisect_right(self.sizes, n) - 1), interpolate(self.sizes, self.measured, n)

    def _corrected(self) -> list:
        out, offset = [], 0.0
        for measured, seen in zip(self.measured, self.ratios, strict=True):
            if seen is not None:
                offset = measured * (seen - 1.0)
            out.append(measured + offset)
        return non_decreasing_from_the_right(out)


def interpolate(sizes, millis, n: int) -> float:
    """Linear interpolation between measured sizes; beyond the largest, its per-token cost."""
    if n <= sizes[0]:
        return millis[0]
    i = bisect.bisect_left(sizes, n)
    if i == len(sizes):
        return millis[-1] * n / sizes[-1]
    a, b, ca, cb = sizes[i - 1], sizes[i], millis[i - 1], millis[i]
    return ca + (cb - ca) * (n - a) / (b - a)


def non_decreasing_from_the_right(millis) -> list:
    """cost(n) = the lowest cost measured at n or any larger size (costs never fall as n grows,
    so marginal costs are never negative, and a spike at one size stays at that size)."""
    out = list(millis)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out


def min_useful_prob(cost: VerifyCost, riding: int = 0) -> float:
    """The acceptance chance below which one more tree token costs more than it brings, in a
    forward that carries `riding` tokens of other requests besides this one's."""
    return max(0.0, (cost(riding + 2) - cost(riding + 1)) / cost(riding + 1))


def grow_tree(tree, paths, cost: VerifyCost, max_nodes: int, force: bool = False, riding: int = 0) -> None:
    """Insert nodes of `paths` (DraftPaths) best-first up to the node budget, then keep the
    prefix of that order with the most expected tokens per millisecond, (E(n) + 1) / cost(n)
    (force: keep them all). One node at a time, a tree stopped at the first node that did not
    pay for itself alone; in service the first extra token costs the most (it wakes other
    experts, and later ones wake few more), so the long suggestion chains that pay as a whole
    were never built. A tree that pays at no size is the root alone (plain decoding).

    riding: tokens of other requests in the same forward. Their tokens wake experts of their
    own, so this tree's tokens cost the step less than they would alone, and the tree is priced
    at cost(riding + its size): under load it grows larger.

    Each heap entry carries the tree node its path has reached, so a node is placed in constant
    time: walking each path from the root again made a 64-token suggestion cost 2,000 lookups."""
    # Only the sizes these paths can reach: the table is rebuilt after every served forward, and
    # a plain step's long-repeat path is often a few tokens where the budget is 64.
    reach = min(max_nodes, len(tree) + sum(len(path.tokens) for path in paths))
    costs = cost.table(reach + riding)
    costs = costs[riding:] if riding else costs
    heap = [(-path.probs[0], i, 0, 0) for i, path in enumerate(paths) if path.tokens]
    heapq.heapify(heap)
    expected, best_rate, best_size = 0.0, 1.0 / costs[len(tree)], len(tree)
    while heap and len(tree) < max_nodes:
        neg_p, i, depth, parent = heapq.heappop(heap)
        tokens, probs = paths[i].tokens, paths[i].probs
        node = tree.children[parent].get(tokens[depth])
        if node is None:
            node = tree.add_child(parent, tokens[depth], paths[i].source, -neg_p)
            expected -= neg_p
            rate = (expected + 1.0) / costs[len(tree)]
            if rate > best_rate:
                best_rate, best_size = rate, len(tree)
        elif tree.probs[node] < -neg_p:
            tree.probs[node] = -neg_p
        if depth + 1 < len(tokens):
            heapq.heappush(heap, (-probs[depth + 1], i, depth + 1, node))
    if not force:
        tree.truncate(best_size)
