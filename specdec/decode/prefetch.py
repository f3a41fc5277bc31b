"""Prefetch: the completion that follows an accepted suggestion, computed while it is on screen.

When a completion is returned to a document, the engine predicts the request that accepting it
would send: the prefix plus the suggestion (and, for clients that accept line by line, plus its
first line), the suffix without what the suggestion typed again, and the same options. Each
prediction becomes a PrefetchJob, a Generation the scheduler steps only while no live request
waits, one pass at a time (Scheduler._background_step). When the prediction comes true, the live
request takes the job: a finished job's result is its answer at once, a running one is joined.

The answer is what the engine would compute cold for that request: a job is taken only when the
request's prompt ids and every option that decides its tokens are the job's own. A request of the
document that matches none of its jobs shows the user did something else: they are dropped. The
caches of a finished or dropped job go to the prompt cache (Generation.release), so even a wrong
guess leaves its prompt's KV for the request that comes instead.

Threads: queue_after() and the taking run on the scheduler's thread; dropping_for() may run on
a submitting thread; the lock guards the job lists and the counters.
"""

import logging
import threading
import time
from dataclasses import dataclass

from specdec.options import CompletionOptions

log = logging.getLogger("specdec.decode.prefetch")

# Options that do not decide a completion's tokens: a request differing from a job only in these
# is the job's request. Time limits are left out on purpose: a job runs without them (it is off
# the user's path), and its answer is the one the engine gives when time does not cut it.
_NOT_DECIDING = ("time_budget_ms", "time_budget_after_newline", "wait_budget_ms", "use_prompt_cache",
                 "document", "slot", "strategy", "prefetch")

def token_key(options: CompletionOptions) -> tuple:
    """What in the options decides the completion's tokens, besides the prompt ids it builds: of
    the prefix, only its last line (the stop rules read it). The rest of the prefix reaches the
    tokens only through the prompt, which a request must match id for id; so a client whose
    window of lines above the cursor moved after a multi-line accept still meets its prefetch
    when the prompt's own cut hides the difference."""
    key = [(name, value) for name, value in vars(options).items() if name not in _NOT_DECIDING]
    return tuple(("prefix", value[value.rfind("\n") + 1 :]) if name == "prefix" else (name, value)
                 for name, value in key)


def accepted_variants(text: str) -> list[str]:
    """What a user may accept of a suggestion: all of it (Tab), and its first line when it has
    more (llama.vim's Shift+Tab, llama.vscode's accept-one-line)."""
    if not text:
        return []
    first = text.split("\n", 1)[0]
    return [text] if not first or first == text else [text, first]


def after_accepting(options: CompletionOptions, accepted: str) -> CompletionOptions:
    """The request an editor sends once `accepted` is inserted at the cursor: the prefix grows by
    it, and the rest of the cursor's line leaves the suffix when the suggestion ended by typing it
    again (an editor replaces it rather than doubling a closing bracket)."""
    suffix = options.suffix
    line_rest = suffix.split("\n", 1)[0]
    if line_rest and accepted.endswith(line_rest):
        suffix = suffix[len(line_rest):]
    return options.with_changes(prefix=options.prefix + accepted, suffix=suffix, time_budget_ms=None,
                                time_budget_after_newline=False, wait_budget_ms=None, slot=None)


@dataclass(frozen=True)
class PrefetchLimits:
    per_document: int = 2  # the whole suggestion and its first line
    total: int = 8  # over every document; the oldest job leaves first
    keep_s: float = 120.0  # a finished job nobody took is dropped after this long


@dataclass
class PrefetchCounts:
    """What /metrics reports: jobs by outcome, and the process CPU seconds of their passes."""

    started: int = 0
    served: int = 0  # finished before its request came, answered from it at once
    joined: int = 0  # still running when its request came, which continued it
    wasted: int = 0  # dropped: the user did something else, a cap, or never asked
    cpu_s: float = 0.0
    wasted_cpu_s: float = 0.0

    @property
    def wasted_share(self) -> float:
        return self.wasted_cpu_s / self.cpu_s if self.cpu_s else 0.0


@dataclass(eq=False)
class PrefetchJob:
    generation: object  # a Generation run as background work
    key: tuple  # token_key of its options
    document: str | None
    batch: int = 0  # which queue() made it: the latest suggestion's jobs run first
    finished_at: float | None = None
    cpu_s: float = 0.0


class Prefetcher:
    def __init__(self, limits: PrefetchLimits = PrefetchLimits(), enabled: bool = True):
        self.limits, self.enabled = limits, enabled
        self.jobs: list[PrefetchJob] = []  # oldest first
        self.batches = 0
        self.dropped: list[PrefetchJob] = []  # left, for the scheduler to finish and release
        self.counts = PrefetchCounts()
        self.lock = threading.Lock()

    def set_enabled(self, enabled: bool) -> None:
        with self.lock:
            self.enabled = enabled
            if not enabled:
                self._drop_where(lambda job: True)

    def wants(self, options: CompletionOptions, text: str, stop_reason: str | None) -> bool:
        """Whether a completion just returned is worth predicting the next request of."""
        answered = stop_reason not in (None, "busy", "error", "cancelled", "superseded")
        return self.enabled and options.prefetch and answered and bool(text) and options.max_tokens > 0

    def queue(self, options: CompletionOptions, text: str, make_generation) -> None:
        """Jobs for the requests that accepting `text` would send; make_generation(options) builds
        each one's Generation. The document's older jobs leave: the user saw a new suggestion."""
        predicted = [after_accepting(options, accepted) for accepted in accepted_variants(text)]
        with self.lock:
            self._drop_where(lambda job: job.document == options.document)
            self.batches += 1
            for wanted in predicted[: self.limits.per_document]:
                self.jobs.append(PrefetchJob(make_generation(wanted.with_changes(prefetch=False)),
                                             token_key(wanted), options.document, self.batches))
                self.counts.started += 1
            while len(self.jobs) > self.limits.total:
                self._drop(self.jobs[0])

    def dropping_for(self, options: CompletionOptions) -> None:
        """A live request arrived: its document's jobs that it cannot take leave."""
        if options.document is None and not self.jobs:
            return
        key = token_key(options)
        with self.lock:
            self._drop_where(lambda job: job.document == options.document and job.key != key)

    def take(self, options: CompletionOptions, prompt_ids: list, max_tokens: int) -> PrefetchJob | None:
        """The job computing exactly this request (the same prompt ids, deciding options and token
        limit, which the scheduler may have capped), now out of the list and counted as served
        (finished) or joined (running); None when there is none. A job not begun yet, or whose
        prompt came out otherwise (retrieved context moved), is no help: it is dropped, and the
        request runs as it would have."""
        key = token_key(options)
        with self.lock:
            for job in self.jobs:
                g = job.generation
                if job.key != key or g.max_tokens != max_tokens:
                    continue
                if g.prompt is None or list(g.prompt.ids) != prompt_ids:  # not begun, or its context moved
                    log.info("prefetch not taken: %s", "not begun" if g.prompt is None else _difference(g.prompt.ids, prompt_ids))
                    self._drop(job)
                    return None
                self.jobs.remove(job)
                if g.is_finished:
                    self.counts.served += 1
                else:
                    self.counts.joined += 1
                return job
        return None

    def next_runnable(self) -> PrefetchJob | None:
        """The job to step next, after dropping finished ones kept too long: among those with work
        left, the latest suggestion's (the one on screen now; an older one was most likely passed
        by), and of its jobs the whole suggestion's before its first line's."""
        now = time.monotonic()
        with self.lock:
            self._drop_where(lambda job: job.finished_at is not None and now - job.finished_at > self.limits.keep_s)
            runnable = [job for job in self.jobs if not job.generation.is_finished]
            return min(runnable, key=lambda job: -job.batch, default=None)

    def has_work(self) -> bool:
        """A job to step, or dropped ones whose caches the scheduler has yet to release."""
        return bool(self.dropped) or self.next_runnable() is not None

    def ran(self, job: PrefetchJob, cpu_s: float) -> None:
        """Count one pass of a job (it may have been dropped meanwhile, from another thread)."""
        with self.lock:
            job.cpu_s += cpu_s
            self.counts.cpu_s += cpu_s
            if job not in self.jobs:
                self.counts.wasted_cpu_s += cpu_s
            if job.generation.is_finished and job.finished_at is None:
                job.finished_at = time.monotonic()

    def take_dropped(self) -> list[PrefetchJob]:
        with self.lock:
            dropped, self.dropped = self.dropped, []
        return dropped

    def snapshot(self) -> PrefetchCounts:
        with self.lock:
            return PrefetchCounts(**vars(self.counts))

    def _drop_where(self, condition) -> None:
        for job in [job for job in self.jobs if condition(job)]:
            self._drop(job)

    def _drop(self, job: PrefetchJob) -> None:
        """(lock held) Out of the list and counted as waste; the scheduler releases its caches."""
        self.jobs.remove(job)
        job.generation.request_cancel("superseded")
        self.dropped.append(job)
        self.counts.wasted += 1
        self.counts.wasted_cpu_s += job.cpu_s


def _difference(predicted, asked) -> str:
    same = next((i for i, (a, b) in enumerate(zip(predicted, asked, strict=False)) if a != b), min(len(predicted), len(asked)))
    return f"the prompt differs at token {same} of {len(asked)} ({len(predicted)} predicted)"
