"""Scheduler: steps every active request in one loop, batching their verify passes.

Each iteration drops finished and cancelled requests, admits waiting ones (prompt-cache
lookup), runs one batched forward over the next chunks of the prompts being prefilled (within
a token budget), asks every active request for its token tree, runs ONE target forward over
all trees (a segment per request), and commits each request's accepted tokens. Requests are cancelled between steps; a request for
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
        self.prefilling: list = []  # admitted, prompt partly in the cache
        self.lock = threading.Condition()
        self.thread = None
        self.running = False
        self.steps = 0
        self.recent = deque(maxlen=256)  # (document, stop reason, tokens, step finished) of finished requests

    # submitting ---------------------------------------------------------------------------

    def submit(self, generation) -> None:
        with self.lock:
            if any(generation is g for g in (*self.waiting, *self.prefilling, *self.active)):
                return  # submitted already (run_until_done after submit): it must not supersede itself
            self._drop_cancelled_waiting()
            if len(self.waiting) >= self.max_queue:
                raise QueueFull(f"{len(self.waiting)} requests already waiting")
            document = generation.request.document
            if document is not None:
                for other in [*self.waiting, *self.prefilling, *self.active]:
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
        while not all(g.finished.is_set() for g in generations):
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
        trees = [(g, g.propose()) for g in self._decoding()]
        if chunks or trees:
            self._forward(chunks, trees)
        self.steps += 1
        self._reap()

    def _forward(self, chunks, trees) -> None:
        """ONE target forward over the prompt chunks and the token trees of this step: on a
        memory-bound machine the experts' weights are read once for both, so a prefill chunk
        rides along with the decoding requests for little more than its own tokens."""
        started = time.perf_counter()
        parts = [part for _, part in chunks] + [g.segment(tree) for g, tree in trees]
        tokens, positions, segments = zip(*parts, strict=True)
        prefilled = sum(seg.length for _, (_, _, seg) in chunks)
        total = prefilled + sum(len(tree) for _, tree in trees)
        rows = None if not chunks else list(range(prefilled, total))
        logits = self.engine.target(torch.cat(tokens), torch.cat(positions), list(segments), logits_rows=rows)
        start = 0
        for g, tree in trees:
            g.commit(tree, logits[start : start + len(tree)])
            start += len(tree)
        for g, _ in chunks:
            if self._guard(g, g.prefill_fed) and not g.prefilling:
                self.prefilling.remove(g)
                self.active.append(g)
        if trees:
            share = (time.perf_counter() - started) * 1000 / len(trees)
            for g, _ in trees:
                if g.request.strategy != "ar":
                    self.engine.record_step(g.request.strategy, g.speculating, share, g.last_step_tokens)

    MAX_DECODING = 4  # requests decoded per step; the rest wait their turn

    def _decoding(self) -> list:
        """The active requests decoded this step: the oldest first. With an MoE on a memory-bound
        machine every request in the batch wakes more experts (measured here: 4 cost 1.8-3.2x
        one, 16 cost 3.9x), and under fast typing the youngest requests are the ones the next
        keystroke supersedes: decoding the survivors first gets a user who paused a completion
        soonest."""
        if len(self.active) <= self.MAX_DECODING:
            return self.active
        return sorted(self.active, key=lambda g: g.started)[: self.MAX_DECODING]

    def _admit(self) -> None:
        """Waiting requests begin (prompt built, prompt cache looked up; no forward) while there is room."""
        while len(self.active) + len(self.prefilling) < self.max_batch:
            with self.lock:
                if not self.waiting:
                    return
                g = self.waiting.popleft()
            if g.cancelled.is_set():
                g._finish(g.stop_reason or "cancelled")
                continue
            if self._guard(g, g.begin):
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

    PREFILL_TOKENS_BUSY = 256  # prompt tokens per step while others decode
    PREFILL_TOKENS_IDLE = 2048  # and while nobody decodes: the whole prompt at once

    def _guard(self, g, action) -> bool:
        """Run one request's action; a request whose prompt cannot be built or kept fails alone."""
        try:
            action()
            return True
        except Exception as err:
            log.exception("prefill failed")
            g.error = err
            g._finish("error")
            if g in self.prefilling:
                self.prefilling.remove(g)
            return False

    def _reap(self) -> None:
        """Finished and cancelled requests leave, giving their caches (full or partly
        prefilled) back to the prompt cache."""
        for queue in (self.prefilling, self.active):
            keep = []
            for g in queue:
                if g.cancelled.is_set() and not g.finished.is_set():
                    g._finish(g.stop_reason or "cancelled")
                if g.finished.is_set():
                    g.release()
                    self.recent.append((g.request.document, g.stop_reason, len(g.generated), self.steps))
                else:
                    keep.append(g)
            queue[:] = keep

    def _fail_all(self) -> None:
        for g in self.prefilling + self.active:
            g.error = RuntimeError("internal error in the scheduler step")
            g._finish("error")
        self.prefilling, self.active = [], []
