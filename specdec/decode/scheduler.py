"""Scheduler: steps every live generation in one loop, batching their verify passes.

Each iteration finishes cancelled generations (and those past a strict time budget) and reaps
the finished ones, admits waiting ones (prompt-cache lookup), runs one batched forward over the
next chunks of the prompts being prefilled (within a token budget) and the token trees of the
decoding ones (a segment per request), and commits each request's accepted tokens. The loop runs
inline (Engine.complete without a server) or on a background thread (the server).

Under load it sheds work nobody will see: a request for a document or a client slot supersedes
the older one still live; a request whose client would give up before it decoded is answered at
once ("busy"); few requests begin per step and each generates less while requests wait for a
decoding slot; and requests a user waits on go before a keystroke burst's young ones.

Threads: submit() runs on the caller's thread, everything else on the loop's. The lock guards
the three queues (waiting, prefilling, active) and the live-by-document and by-slot maps;
generations are changed only by the loop, except request_cancel(), which is safe from any
thread, and a "busy" answer, which submit() gives before the loop ever sees the request.
"""

import logging
import threading
import time
from collections import deque
from typing import NamedTuple

import torch

from specdec.decode.policy import learn_step
from specdec.decode.states import State
from specdec.models.kvcache import under_inference_mode

log = logging.getLogger("specdec.decode.scheduler")


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
    ADMIT_BUSY = 4  # requests begun per step while others decode (each begin tokenizes a prompt)
    LOAD_TOKEN_CAP = 16  # generated tokens per request while requests wait for a decoding slot
    QUIET_MS = 200  # a request of a keystroke burst left alone this long is a pause: a user waits on it
    PREFETCH_CHUNK = 32  # prompt tokens per background pass: a request arriving meanwhile waits for one

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
        self._live_by_slot = {}
        self.load = LoadEstimate()

    # submitting (any thread) --------------------------------------------------------------

    def submit(self, generation) -> None:
        with self.lock:
            if generation.state is not State.QUEUED or generation in self.waiting:
                return  # submitted already (run_until_done after submit): it must not supersede itself
            if len(self.waiting) >= self.max_queue:
                self._drop_cancelled_waiting()
                if len(self.waiting) >= self.max_queue:
                    raise QueueFull(f"{len(self.waiting)} requests already waiting")
            for key, live in ((generation.options.document, self._live_by_document),
                              (generation.options.slot, self._live_by_slot)):
                if key is not None:
                    older = live.get(key)
                    if older is not None and older is not generation:
                        older.request_cancel("superseded")
                        generation.in_burst = True
                    live[key] = generation
            self._drop_cancelled_waiting()
            budget, expected = generation.options.client_wait_ms, self._expected_wait_ms()
            if budget is not None and expected > budget:
                generation.reject_busy(expected)  # its client would have moved on before it decoded
                self._left(generation)
                return
            self.waiting.append(generation)
            self.lock.notify()

    def _expected_wait_ms(self) -> float:
        """How long a request arriving now waits before its first decoding step (lock held): none
        while a decoding slot is free, else what the latest requests waited (a moving average,
        which counts what superseding and budgets spared them)."""
        queued = (*self.waiting, *self.prefilling, *self.active)
        live = sum(g.cancel_reason is None and not g.is_finished for g in queued)
        return self.load.wait_ms if live >= self.MAX_DECODING else 0.0

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
                while self.running and not self.waiting and not self.prefilling and not self.active \
                        and not self.engine.prefetcher.has_work():
                    self.lock.wait(timeout=0.5)
            if not self.running:
                break
            try:
                self.step()
            except Exception:  # a bug must not kill the loop that every request waits on
                log.exception("scheduler step failed")
                self._fail_all()

    @under_inference_mode  # caches are inference tensors: every in-place update must run in this mode
    def step(self) -> None:
        # Reap first: a superseded request gives its caches back to the prompt cache before the
        # request that superseded it (one keystroke later, same prompt but the tail) begins.
        self._reap()
        self._admit()
        chunks = self._prefill_chunks()
        trees, proposing_ms = [], []
        decoding = self._decoding()
        # Each request's tree rides with the other requests' tokens (at least their roots). A prompt
        # chunk riding too is left out: it passes in a few steps, and priced in, it would make a
        # tree of every guess the sources have.
        riding = len(decoding) - 1
        for g in decoding:
            started = time.perf_counter()
            trees.append((g, g.propose(riding)))
            proposing_ms.append((time.perf_counter() - started) * 1000 - g.catch_up_ms)
        if chunks or trees:
            self._forward(chunks, trees, proposing_ms)
        elif not self.waiting:
            self._background_step()
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
        prefilled = sum(part.segment.length for _, part in chunks)
        total = prefilled + sum(len(tree) for _, tree in trees)
        rows = None if not chunks else list(range(prefilled, total))
        target = self.engine.target
        joined = (torch.cat(tokens), torch.cat(positions)) if len(parts) > 1 else (tokens[0], positions[0])
        out = target.run(*joined, list(segments), logits_rows=rows)
        logits = out.rows()
        woken = target.experts_woken() if trees else 0
        features = out.captured  # [all rows, k*H] when an EAGLE-3 head reads them, else None
        start, added = 0, []
        for g, tree in trees:
            g.stats.experts_woken += woken
            rows_of = None if features is None else features[prefilled + start : prefilled + start + len(tree)]
            added.append(g.commit(tree, logits[start : start + len(tree)], rows_of))
            start += len(tree)
        offset = 0
        for g, part in chunks:
            rows_of = None if features is None else features[offset : offset + part.segment.length]
            offset += part.segment.length
            fed = self._guard(g, lambda g=g, rows_of=rows_of: g.prefill_fed(rows_of))
            if fed and g.state is State.DECODING and not g.background:
                with self.lock:
                    self.prefilling.remove(g)
                    self.active.append(g)
                self._decode_began(g)
        if trees:
            elapsed = (time.perf_counter() - started) * 1000
            if len(trees) == 1 and not chunks and self.engine.verify_cost is not None:
                self.engine.verify_cost.observe(len(trees[0][1]), elapsed)  # a verify alone corrects the curve
            share = elapsed / len(trees)
            proposing_ms = list(proposing_ms) or [0.0] * len(trees)
            for (g, _), count, own_ms in zip(trees, added, proposing_ms, strict=True):
                if g.draft_chosen:  # steps with the draft against steps without it (proposing._draft_decision)
                    learn_step(g.policies, g.speed_key, g.drafting, share + own_ms, count)

    def _background_step(self) -> None:
        """One pass of the next prefetch job (Prefetcher.next_runnable), run only when no request waits:
        its begin and first forward, a PREFETCH_CHUNK of its prompt, or one decoding step. A
        failing job is dropped; it never fails the live requests."""
        prefetcher = self.engine.prefetcher
        job = prefetcher.next_runnable()
        if job is None:
            return
        g, started = job.generation, time.process_time()
        try:
            if g.state is State.QUEUED:
                g.begin()
            if g.prefilling:
                self._forward([(g, g.prefill_segment(min(self.PREFETCH_CHUNK, g.prefill_remaining())))], [])
            elif not g.is_finished:
                self._forward([], [(g, g.propose(0))])
        except Exception as err:
            log.exception("prefetch step failed")
            g.fail(err)
        prefetcher.ran(job, time.process_time() - started)
        if g.is_finished:
            g.release()  # its caches go to the prompt cache, under the predicted prompt and its answer

    def _decoding(self) -> list:
        """The decoding requests stepped now: those a user waits on (_waited_on), oldest first.
        With an MoE on a memory-bound machine every request in the batch wakes more experts, and
        under fast typing a burst's young requests are the ones the next keystroke supersedes:
        leaving them out keeps the batch small for a user who paused."""
        live = sorted((g for g in self.active if not g.is_finished), key=lambda g: g.started)
        waited_on = [g for g in live if self._waited_on(g)]
        if waited_on:  # a keystroke burst's young requests wait: the next keystroke supersedes them
            live = waited_on
        return live[: self.MAX_DECODING]

    def _waited_on(self, g, now: float | None = None) -> bool:
        """Whether a user is likely waiting on this request: it superseded no live request of
        its document (a client with one request in flight, or the first after a gap), or its
        document has left it alone for QUIET_MS (a pause after a burst of keystrokes)."""
        return not g.in_burst or (now or time.perf_counter()) - g.started >= self.QUIET_MS / 1000

    def _admit(self) -> None:
        """Waiting requests begin (prompt built, prompt cache looked up; no forward) while there
        is room, oldest first; while others decode, at most ADMIT_BUSY a step, since each begin
        tokenizes a whole prompt and a request that waits a step more is often superseded (for
        free) before it costs anything. While requests wait for a decoding slot, each one begun
        generates at most LOAD_TOKEN_CAP tokens."""
        begun = 0
        while True:
            with self.lock:
                full = len(self.active) + len(self.prefilling) >= self.max_batch
                if not self.waiting or full or (self.active and begun >= self.ADMIT_BUSY):
                    return
                g = self.waiting.popleft()
                crowded = len(self.active) + len(self.prefilling) + len(self.waiting) >= self.MAX_DECODING
            if g.cancel_reason is not None:
                g.finish(g.cancel_reason)
                self._left(g)
                continue
            if crowded:
                g.cap_tokens(self.LOAD_TOKEN_CAP)
            begun += 1
            if self._guard(g, g.begin):
                with self.lock:
                    (self.prefilling if g.prefilling else self.active).append(g)
                self._decode_began(g)

    def _prefill_chunks(self) -> list:
        """The next prompt chunks of the prefilling requests, within a token budget per step, so
        that a cold 1,500-token prompt cannot stall everyone else's decoding; among the requests
        a user waits on and then among the rest, fewest tokens left first, so that a keystroke
        follow-up (a few tokens) waits for no cold prompt."""
        budget = self.PREFILL_TOKENS_BUSY if self.active else self.PREFILL_TOKENS_IDLE
        chosen, now = [], time.perf_counter()
        for g in sorted(self.prefilling, key=lambda g: (not self._waited_on(g, now), g.prefill_remaining())):
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
        now = time.perf_counter()
        # A strict deadline is decided a plain step early: a step that would end past it delays the
        # answer beyond the budget for tokens the client asked not to wait for.
        step_s = self.engine.verify_cost(1) / 1000 if self.engine.verify_cost is not None else 0.0
        with self.lock:
            queues = (self.prefilling, self.active)
            for queue in queues:
                for g in queue:
                    if g.is_finished:
                        continue
                    if g.cancel_reason is not None:
                        g.finish(g.cancel_reason)
                    elif g.past_deadline(now + step_s):  # also those waiting for a decoding slot
                        g.finish("time")
            gone = [g for queue in queues for g in queue if g.is_finished]
            if gone:  # most steps finish nothing: the lists stay as they are
                self.prefilling[:] = [g for g in self.prefilling if not g.is_finished]
                self.active[:] = [g for g in self.active if not g.is_finished]
        for g in gone:
            g.release()
            self._left(g)
            self.engine.prefetch_after(g)
        for job in self.engine.prefetcher.take_dropped():
            if not job.generation.is_finished:  # dropping asked it to cancel
                job.generation.finish(job.generation.cancel_reason)
            job.generation.release()

    def _decode_began(self, g) -> None:
        if g.decode_started is not None:
            self.load.waited((g.decode_started - g.started) * 1000)

    def _left(self, g) -> None:
        with self.lock:
            for key, live in ((g.options.document, self._live_by_document), (g.options.slot, self._live_by_slot)):
                if key is not None and live.get(key) is g:
                    del live[key]
            self.recent.append(FinishedRecord(g.options.document, g.stop_reason, len(g.generated), self.steps))

    def _fail_all(self) -> None:
        with self.lock:
            failing = self.prefilling + self.active
            self.prefilling, self.active = [], []
        for g in failing:
            g.fail(RuntimeError("internal error in the scheduler step"))
            self._left(g)


class LoadEstimate:
    """What the latest requests waited from arrival to their first decoding step, as an
    exponential moving average: the wait a request arriving now should expect."""

    WEIGHT = 0.1

    def __init__(self):
        self.wait_ms = 0.0

    def waited(self, millis: float) -> None:
        self.wait_ms += self.WEIGHT * (millis - self.wait_ms)
