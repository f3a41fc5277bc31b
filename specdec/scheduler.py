"""Scheduler: steps every active request in one loop, batching their verify passes.

Each iteration admits waiting requests (prefill), drops cancelled ones, asks every active
request for its token tree, runs ONE target forward over all trees (a segment per request),
and commits each request's accepted tokens. Requests are cancelled between steps; a request for
a document supersedes the older request for it still running. The loop runs inline (for
Engine.complete) or on a background thread (for the server).
"""

import logging
import threading
import time
from collections import deque

import torch

log = logging.getLogger("specdec.scheduler")


class QueueFull(RuntimeError):
    """More requests waiting than the scheduler accepts."""


class Scheduler:
    def __init__(self, engine, max_batch: int = 16, max_queue: int = 64):
        self.engine = engine
        self.max_batch, self.max_queue = max_batch, max_queue
        self.waiting: deque = deque()
        self.active: list = []
        self.lock = threading.Condition()
        self.thread = None
        self.running = False
        self.steps = 0
        self.recent = deque(maxlen=256)  # (document, stop reason, tokens, step finished) of finished requests

    # submitting ---------------------------------------------------------------------------

    def submit(self, generation) -> None:
        with self.lock:
            self._drop_cancelled_waiting()
            if len(self.waiting) >= self.max_queue:
                raise QueueFull(f"{len(self.waiting)} requests already waiting")
            document = generation.request.document
            if document is not None:
                for other in list(self.waiting) + self.active:
                    if other.request.document == document:
                        other.stop_reason = "superseded"
                        other.cancel()
            self._drop_cancelled_waiting()
            self.waiting.append(generation)
            self.lock.notify()

    def _drop_cancelled_waiting(self) -> None:
        """Cancelled or superseded requests that never started leave the queue at once (caller holds the lock)."""
        for g in [g for g in self.waiting if g.cancelled.is_set()]:
            self.waiting.remove(g)
            g._finish(g.stop_reason or "cancelled")
            self.recent.append((g.request.document, g.stop_reason, 0, self.steps))

    def queue_depth(self) -> int:
        return len(self.waiting) + len(self.active)

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
        while not all(g.finished.is_set() for g in generations):
            self.step()

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while self.running:
            with self.lock:
                while self.running and not self.waiting and not self.active:
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
        self._admit()
        self._reap()
        if not self.active:
            return
        started = time.perf_counter()
        trees = [(g, g.propose()) for g in self.active]
        tokens, positions, segments = zip(*(g.segment(t) for g, t in trees), strict=True)
        logits = self.engine.target(torch.cat(tokens), torch.cat(positions), list(segments))
        start = 0
        for g, tree in trees:
            g.commit(tree, logits[start : start + len(tree)])
            start += len(tree)
        share = (time.perf_counter() - started) * 1000 / len(trees)
        for g, _ in trees:
            if g.request.strategy != "ar":
                self.engine.record_step(g.request.strategy, g.speculating, share, g.last_step_tokens)
        self.steps += 1
        self._reap()

    def _admit(self) -> None:
        while len(self.active) < self.max_batch:
            with self.lock:
                if not self.waiting:
                    return
                g = self.waiting.popleft()
            if g.cancelled.is_set():
                g._finish(g.stop_reason or "cancelled")
                continue
            try:
                g.prepare()
            except Exception as err:  # a request that cannot be prefilled fails alone
                log.exception("prefill failed")
                g.error = err
                g._finish("error")
                continue
            if g.finished.is_set():
                g.release()
            else:
                self.active.append(g)

    def _reap(self) -> None:
        keep = []
        for g in self.active:
            if g.cancelled.is_set() and not g.finished.is_set():
                g._finish(g.stop_reason or "cancelled")
            if g.finished.is_set():
                g.release()
                self.recent.append((g.request.document, g.stop_reason, len(g.generated), self.steps))
            else:
                keep.append(g)
        self.active = keep

    def _fail_all(self) -> None:
        for g in self.active:
            g.error = RuntimeError("internal error in the scheduler step")
            g._finish("error")
        self.active = []
