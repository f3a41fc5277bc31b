"""Scheduler: steps every live generation in one loop, batching their verify passes.

Each iteration finishes cancelled generations and reaps the finished ones, admits waiting ones
(prompt-cache lookup), runs one batched forward over the next chunks of the prompts being
prefilled (within a token budget) and the token trees of the decoding ones (a segment per
request), and commits each request's accepted tokens. A request for a document supersedes the
older request for it still live. The loop runs inline (Engine.complete without a server) or on
a background thread (the server).

Threads: submit() runs on the caller's thread, everything else on the loop's. The lock guards
the three queues (waiting, prefilling, active) and the live-by-document map; generations are
changed only by the loop, except request_cancel(), which is safe from any thread.
"""

import logging
import threading
import time
from collections import deque
from typing import NamedTuple

import torch

from specdec.generation import State
from specdec.policy import learn_step

log = logging.getLogger("specdec.scheduler")


class QueueFull(RuntimeError):
    """More requests waiting than the scheduler accepts."""


class FinishedRecord(NamedTuple):
    """One finished generation, as the scheduler saw it leave."""

    document: str | None
    stop_reason: str | None
    tokens: int  # generated tokens
    step: int  # the scheduler step it finished in


class Scheduler:
    PREFILL_TOKENS_BUSY = 256  # prompt tokens per step while others decode
    PREFILL_TOKENS_IDLE = 2048  # and while nobody decodes: the whole prompt at once
    MAX_DECODING = 4  # requests decoded per step; the rest wait their turn

    def __init__(self, engine, max_batch: int = 16, max_queue: int = 64):
        self.engine = engine
        self.max_batch, self.max_queue = max_batch, max_queue
        self.waiting: deque = deque()
        self.prefilling: list = []  # admitted, prompt partly in the cache
        self.active: list = []  # decoding
        self._live_by_document = {}
        self.lock = threading.Condition()
        self.thread = None
        self.running = False
        self.steps = 0
        self.recent: deque = deque(maxlen=256)  # FinishedRecords, oldest first

    # submitting (any thread) --------------------------------------------------------------

    def submit(self, generation) -> None:
        with self.lock:
            if generation.state is not State.QUEUED or generation in self.waiting:
                return  # submitted already (run_until_done after submit): it must not supersede itself
            if len(self.waiting) >= self.max_queue:
                self._drop_cancelled_waiting()
                if len(self.waiting) >= self.max_queue:
                    raise QueueFull(f"{len(self.waiting)} requests already waiting")
            document = generation.options.document
            if document is not None:
                older = self._live_by_document.get(document)
                if older is not None:
                    older.request_cancel("superseded")
                self._live_by_document[document] = generation
            self._drop_cancelled_waiting()
            self.waiting.append(generation)
            self.lock.notify()

    def _drop_cancelled_waiting(self) -> None:
        """Cancelled or superseded requests that never started leave the queue at once (lock held).
        A superseded request finishes on this thread: it was never seen by the loop."""
        for g in [g for g in self.waiting if g.cancel_reason is not None]:
            self.waiting.remove(g)
            g.finish(g.cancel_reason)
            self._left(g)

    def queue_depth(self) -> int:
        with self.lock:
            return len(self.waiting) + len(self.prefilling) + len(self.active)

    # running ------------------------------------------------------------------------------

    def start(self) -> None:
        if self.thread is None:
            self.running = True
            self.thread = threading.Thread(target=self._loop, name="specdec-scheduler", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        self.running = False
        with self.lock:
            self.lock.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=10)
            self.thread = None

    def run_until_done(self, generations) -> None:
        """Inline driving (no background thread): step until these generations finish."""
        for g in generations:
            self.submit(g)
        while not all(g.is_finished for g in generations):
            self.step()

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while self.running:
            with self.lock:
                while self.running and not self.waiting and not self.prefilling and not self.active:
                    self.lock.wait(timeout=0.5)
            if not self.running:
                break
            try:
                self.step()
            except Exception:  # a bug must not kill the loop that every request waits on
                log.exception("scheduler step failed")
                self._fail_all()

    @torch.inference_mode()  # caches are inference tensors: every in-place update must run in this mode
    def step(self) -> None:
        # Reap first: a superseded request gives its caches back to the prompt cache before the
        # request that superseded it (one keystroke later, same prompt but the tail) begins.
        self._reap()
        self._admit()
        chunks = self._prefill_chunks()
        trees, proposing_ms = [], []
        for g in self._decoding():
            started = time.perf_counter()
            trees.append((g, g.propose()))
            proposing_ms.append((time.perf_counter() - started) * 1000)
        if chunks or trees:
            self._forward(chunks, trees, proposing_ms)
        self.steps += 1
        self._reap()

    def _forward(self, chunks, trees, proposing_ms=()) -> None:
        """ONE target forward over the prompt chunks and the token trees of this step: on a
        memory-bound machine the experts' weights are read once for both, so a prefill chunk
        rides along with the decoding requests for little more than its own tokens.

        A request's step time, which decides whether it speculates, is its share of the forward
        plus its own proposing (draft forwards and lookups): speculation must beat a plain step
        with its drafting paid."""
        started = time.perf_counter()
        parts = [part for _, part in chunks] + [g.segment(tree) for g, tree in trees]
        tokens, positions, segments = zip(*parts, strict=True)
        prefilled = sum(seg.length for _, (_, _, seg) in chunks)
        total = prefilled + sum(len(tree) for _, tree in trees)
        rows = None if not chunks else list(range(prefilled, total))
        target = self.engine.target
        logits = target(torch.cat(tokens), torch.cat(positions), list(segments), logits_rows=rows)
        woken = target.experts_woken() if trees else 0
        features = target.captured  # [all rows, k*H] when an EAGLE-3 head reads them, else None
        start, added = 0, []
        for g, tree in trees:
            g.stats.experts_woken += woken
            rows_of = None if features is None else features[prefilled + start : prefilled + start + len(tree)]
            added.append(g.commit(tree, logits[start : start + len(tree)], rows_of))
            start += len(tree)
        offset = 0
        for g, (_, _, segment) in chunks:
            rows_of = None if features is None else features[offset : offset + segment.length]
            offset += segment.length
            if self._guard(g, lambda g=g, rows_of=rows_of: g.prefill_fed(rows_of)) and g.state is State.DECODING:
                with self.lock:
                    self.prefilling.remove(g)
                    self.active.append(g)
        if trees:
            share = (time.perf_counter() - started) * 1000 / len(trees)
            proposing_ms = list(proposing_ms) or [0.0] * len(trees)
            for (g, _), count, own_ms in zip(trees, added, proposing_ms, strict=True):
                if g.options.strategy != "ar":
                    learn_step(g.policies, g.options.strategy, g.speculating, share + own_ms, count)

    def _decoding(self) -> list:
        """The decoding requests stepped now: the oldest first. With an MoE on a memory-bound
        machine every request in the batch wakes more experts, and under fast typing the
        youngest requests are the ones the next keystroke supersedes: decoding the survivors
        first gets a user who paused a completion soonest."""
        live = [g for g in self.active if not g.is_finished]
        if len(live) <= self.MAX_DECODING:
            return live
        return sorted(live, key=lambda g: g.started)[: self.MAX_DECODING]

    def _admit(self) -> None:
        """Waiting requests begin (prompt built, prompt cache looked up; no forward) while there is room."""
        while True:
            with self.lock:
                if not self.waiting or len(self.active) + len(self.prefilling) >= self.max_batch:
                    return
                g = self.waiting.popleft()
            if g.cancel_reason is not None:
                g.finish(g.cancel_reason)
                self._left(g)
                continue
            if self._guard(g, g.begin):
                with self.lock:
                    (self.prefilling if g.prefilling else self.active).append(g)

    def _prefill_chunks(self) -> list:
        """The next prompt chunks of the prefilling requests, within a token budget per step, so
        that a cold 1,500-token prompt cannot stall everyone else's decoding; fewest tokens left
        first, so that a keystroke follow-up (a few tokens) waits for no cold prompt."""
        budget = self.PREFILL_TOKENS_BUSY if self.active else self.PREFILL_TOKENS_IDLE
        chosen = []
        for g in sorted(self.prefilling, key=lambda g: g.prefill_remaining()):
            if budget <= 0:
                break
            count = min(budget, g.prefill_remaining())
            chosen.append((g, g.prefill_segment(count)))
            budget -= count
        return chosen

    def _guard(self, g, action) -> bool:
        """Run one request's action; a request whose prompt cannot be built or kept fails alone."""
        try:
            action()
            return True
        except Exception as err:
            log.exception("prefill failed")
            g.fail(err)
            with self.lock:
                if g in self.prefilling:
                    self.prefilling.remove(g)
            self._left(g)
            return False

    def _reap(self) -> None:
        """Cancelled requests finish; finished ones leave, giving their caches (full or partly
        prefilled) back to the prompt cache."""
        with self.lock:
            queues = (self.prefilling, self.active)
            for queue in queues:
                for g in queue:
                    if g.cancel_reason is not None and not g.is_finished:
                        g.finish(g.cancel_reason)
            gone = [g for queue in queues for g in queue if g.is_finished]
            self.prefilling[:] = [g for g in self.prefilling if not g.is_finished]
            self.active[:] = [g for g in self.active if not g.is_finished]
        for g in gone:
            g.release()
            self._left(g)

    def _left(self, g) -> None:
        with self.lock:
            document = g.options.document
            if document is not None and self._live_by_document.get(document) is g:
                del self._live_by_document[document]
            self.recent.append(FinishedRecord(document, g.stop_reason, len(g.generated), self.steps))

    def _fail_all(self) -> None:
        with self.lock:
            failing = self.prefilling + self.active
            self.prefilling, self.active = [], []
        for g in failing:
            g.fail(RuntimeError("internal error in the scheduler step"))
            self._left(g)
