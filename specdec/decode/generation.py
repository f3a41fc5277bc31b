"""Generation: one completion request as the scheduler steps it, an explicit state machine
(specdec.decode.states). Every transition goes through _enter(), which refuses the illegal ones. The scheduler drives a
generation only through its public methods: begin, prefill_segment/prefill_fed, propose/segment/
commit, finish, release. The thread that submitted it may call request_cancel() at any time; the
scheduler finishes a cancelled generation between steps.

Flow of one step: propose() (a TokenTree of the sources' DraftPaths) -> the scheduler's batched
target forward over segment() -> commit() (acceptance, caches, stop rules) -> Result at the end.
"""

import threading
import time

from specdec.decode import admission, proposing
from specdec.decode.accept import Sampling, Uniforms, accept
from specdec.decode.decoding import DecodeContext
from specdec.decode.policy import speed_key
from specdec.decode.states import NEXT, IllegalTransition, State
from specdec.decode.stats import Result, Stats
from specdec.decode.stops import Output, StopCut, rules_for
from specdec.decode.tree import RootInput, TokenTree
from specdec.models.model import StepInput
from specdec.options import CompletionOptions
from specdec.prompt.detokenize import TextStream

# What a request takes over from the prefetch job it continues (Generation._take_prefetch).
_TAKEN_OVER = ("prompt", "healing", "committed", "cache", "draft", "eagle", "spare", "output")


class Generation:
    def __init__(self, ctx: DecodeContext, options: CompletionOptions):
        self.ctx, self.options = ctx, options
        self.state = State.QUEUED
        self.stop = StopCut(None, None)  # why it finished, once FINISHED
        self.error: Exception | None = None
        self.finished = threading.Event()
        self._cancel_reason: str | None = None  # set by another thread; acted on between steps
        self.listeners = []  # callback(text, done) on the scheduler thread, for streaming
        self.policies = ctx.policies_for(options.document)
        # Built when the request begins, on the scheduler thread: a request superseded while
        # it waits (most keystrokes, when typing fast) is never tokenized.
        self.prompt = None
        self.healing = None  # the prompt's healed text not spelled yet (fim.Healing)
        self.committed: list[int] = []  # prompt then generated tokens (the target's sequence)
        self.cache = self.draft = self.eagle = self.spare = None
        self._plain = RootInput()  # a plain step's tensors, made once and rewritten
        banned = tuple(sorted(ctx.prompts.stop_ids)) if options.ignore_eos else ()
        self.sampling = Sampling(options.temperature, options.top_p, options.top_k, banned)
        self.uniforms = Uniforms(options.seed)
        self.output = Output(rules_for(options.prefix, options.suffix, options.mode, options.n_indent, options.stop),
                             TextStream(ctx.prompts.tokenizer, ctx.prompts.token_bytes))
        self.max_tokens = options.max_tokens  # the scheduler may cap it under load (cap_tokens)
        self.draft_chosen = self.drafting = False  # whether the policy chose this step's drafting, and what
        self.riding, self.speed_key = 0, speed_key(options.strategy, False)  # this step's company (see propose)
        self.catch_up_ms = 0.0  # of this step's proposing, spent bringing the draft's cache up to the prompt
        self.stats = Stats()
        self.started = time.perf_counter()
        self.decode_started: float | None = None
        self.deadline: float | None = None  # a strict time budget's end, set when decoding begins
        self.in_burst = False  # it superseded a live request of its document (set by the scheduler)
        self.background = False  # a prefetch job (specdec.decode.prefetch): stepped only while no request waits

    # states -------------------------------------------------------------------------------

    def _enter(self, state: State) -> None:
        if state not in NEXT[self.state]:
            raise IllegalTransition(f"generation cannot go from {self.state.value} to {state.value}")
        self.state = state

    @property
    def prefilling(self) -> bool:
        return self.state is State.PREFILLING

    @property
    def is_finished(self) -> bool:
        return self.state is State.FINISHED

    def request_cancel(self, reason: str = "cancelled") -> None:
        """Thread-safe: the scheduler finishes the generation with this reason between steps."""
        if self._cancel_reason is None:
            self._cancel_reason = reason

    @property
    def stop_reason(self) -> str | None:
        return self.stop.reason

    @property
    def cancel_reason(self) -> str | None:
        return self._cancel_reason

    def finish(self, reason: str, matched: str = "") -> None:
        """The one way into FINISHED; the reason given is the reason recorded."""
        self._enter(State.FINISHED)
        self.stop = StopCut(self.stop.position, reason, matched)
        self.finished.set()
        self._notify(done=True)

    def past_deadline(self, now: float | None = None) -> bool:
        return self.deadline is not None and (now or time.perf_counter()) > self.deadline

    def cap_tokens(self, cap: int) -> None:
        """Generate at most `cap` tokens (the scheduler sheds work under load); the cap is reported."""
        if cap < self.max_tokens:
            self.max_tokens = self.stats.tokens_cap = cap

    def reject_busy(self, expected_wait_ms: float) -> None:
        """Answered at once, empty: the expected wait is longer than the request's budget."""
        self.stats.expected_wait_ms = expected_wait_ms
        self.finish("busy")

    def fail(self, error: Exception) -> None:
        self.error = error
        if not self.is_finished:
            self.finish("error")

    def _notify(self, done: bool = False) -> None:
        for listener in list(self.listeners):
            listener(self.current_text(), done)

    # prefill ------------------------------------------------------------------------------

    def begin(self) -> None:
        """Build the prompt and take its longest cached prefix (specdec.decode.admission), or the prefetch
        job computing this very request; the rest is fed by prefill_segment()."""
        ctx, options = self.ctx, self.options
        self.prompt, self.stats.retrieval_ms = admission.build_prompt(ctx, options)
        self.stats.context_chunks, self.stats.context_tokens = self.prompt.context_chunks, self.prompt.context_tokens
        self.healing, self.output.healed_chars = self.prompt.healing, len(self.prompt.healed_text)
        self.committed = ids = list(self.prompt.ids)
        wants_prefetch = options.prefetch and not self.background  # "prefetch": false computes it all itself
        if wants_prefetch and self._take_prefetch(ctx.prefetcher.take(options, ids, self.max_tokens)):
            return
        taken = admission.take_caches(ctx, options, ids)
        self.cache, self.draft, self.eagle, self.spare = taken.cache, taken.draft, taken.eagle, taken.spare
        self.stats.prefill_tokens, self.stats.cached_tokens = len(ids) - taken.reuse, taken.reuse
        self._enter(State.PREFILLING)
        if self.prefill_remaining() == 0:
            self._prefilled()

    def _take_prefetch(self, job) -> bool:
        """Continue a prefetch job computing this very request (the same prompt ids and deciding
        options): its caches, tokens and text become this request's, and a finished job's answer
        is this one's at once. False when there is none."""
        if job is None:
            return False
        taken = job.generation
        for name in _TAKEN_OVER:
            setattr(self, name, getattr(taken, name))
        taken.cache = taken.draft = taken.eagle = taken.spare = None  # this request releases them now
        self.stats = Stats(**taken.stats.as_dict())
        self.stats.prefetched = "served" if taken.is_finished else "joined"
        self._enter(State.PREFILLING)
        if taken.state is not State.PREFILLING:  # its prediction so far counts against the time limit
            self._prefilled(taken.decode_started)
        if taken.is_finished and not self.is_finished:
            self.stop = taken.stop
            self.finish(taken.stop.reason, taken.stop.matched)
        return True

    def prefill_remaining(self) -> int:
        """Prompt tokens not yet in the cache (all but the last one, which the first step feeds)."""
        return len(self.committed) - 1 - self.cache.length

    def prefill_segment(self, count: int) -> StepInput:
        """The next `count` prompt tokens, for a batched forward."""
        return StepInput.next_chunk(self.committed, self.cache, count)

    def prefill_fed(self, features=None) -> None:
        """After the forward over prefill_segment()'s tokens: keep them (and the target's captured
        hidden states [n, k*H] of them, for an EAGLE-3 head); finish the prefill if done."""
        self.cache.keep_all()
        if self.eagle is not None and features is not None:
            self.eagle.extend(features)
            self.eagle.sync(self.committed)
        if self.prefill_remaining() == 0:
            self._prefilled()

    def _prefilled(self, decode_started: float | None = None) -> None:
        # A request a user waits on brings the draft's cache up to the prompt when a step first
        # drafts (_catch_up): an adaptive engine rarely drafts, and syncing a cold prompt through
        # the draft at every prefill would charge each request that came to a new place for a
        # draft prefill it mostly never uses. A request that generates nothing is a client
        # warming the caches (llama.vim's n_predict 0), off the user's path: it warms the draft's too.
        # An EAGLE-3 head is synced chunk by chunk as the prompt is fed (prefill_fed): one layer
        # over features the target computes anyway costs a few percent of the prefill, where a
        # first drafting step after a long prompt would pay all of it at once, while the user waits.
        if self.draft is not None and self.options.max_tokens == 0:
            self.draft.sync(self.committed)
        if self.eagle is not None:
            self.eagle.sync(self.committed)
        self.stats.prefill_ms = (time.perf_counter() - self.started) * 1000
        self.decode_started = decode_started or time.perf_counter()
        if self.options.strict_budget_ms is not None:
            self.deadline = self.decode_started + self.options.strict_budget_ms / 1000
        self._enter(State.DECODING)
        if self.max_tokens == 0:
            self.finish("limit")

    # one step -----------------------------------------------------------------------------

    @property
    def healing_pending(self) -> bool:
        return self.healing is not None

    @property
    def healing_left(self) -> str:
        """The healed text the completion has not spelled yet."""
        return self.healing.left if self.healing is not None else ""

    def propose(self, riding: int = 0) -> TokenTree:
        """The token tree of this step (specdec.decode.proposing)."""
        return proposing.propose(self, self.ctx, riding)

    def segment(self, tree: TokenTree) -> StepInput:
        """The tree's tokens for the batched forward, after the committed ones."""
        if len(tree) == 1:
            return self._plain.at(tree.tokens[0], len(self.committed) - 1, self.cache)
        return tree.step_input(self.cache, len(self.committed) - 1)

    def commit(self, tree: TokenTree, logits, features=None) -> int:
        """Accept against the target's logits [len(tree), vocab] (and keep its captured hidden
        states [len(tree), k*H] of the kept nodes); update caches, text and stops.
        Returns the number of tokens this step added to the sequence."""
        if self.state is not State.DECODING:
            raise IllegalTransition(f"commit on a {self.state.value} generation")
        result = accept(tree, logits, self.sampling, self.uniforms, self.healing, position=len(self.committed))
        self.cache.keep([0] + result.nodes)
        if self.eagle is not None and features is not None:
            self.eagle.extend(features[[0] + result.nodes])
        self.stats.count_pass([tree.sources[n] for n in result.nodes])
        if len(tree) > 1:  # a root alone proposed nothing to learn from
            proposing.learn(self.policies, tree, result.nodes)
        new_tokens = [tree.tokens[n] for n in result.nodes] + [result.bonus]
        self.committed.extend(new_tokens)
        for token in new_tokens:
            if self._append(token):
                break
        if not self.is_finished and self._over_time():
            self.finish("time")
        if not self.is_finished:
            self._notify()
        return len(new_tokens)

    def _append(self, token: int) -> bool:
        """Add one generated token; True when a stop rule ends the completion."""
        if token in self.ctx.prompts.stop_ids:
            self.finish("eos")
            return True
        if self.healing is not None:
            self.healing = self.healing.after(token)
        cut = self.output.append(token)
        if cut.position is not None:
            self.stop = cut
            self.finish(cut.reason, cut.matched)
            return True
        if len(self.generated) >= self.max_tokens:
            self.finish("limit")
            return True
        return False

    def _over_time(self) -> bool:
        """A strict budget ends prediction at its deadline; llama.cpp's rule (after_newline)
        ends it only once a newline has been generated."""
        budget = self.options.time_budget_ms
        if budget is None or self.decode_started is None:
            return False
        if self.deadline is not None:
            return self.past_deadline()
        if "\n" not in self.output.text:
            return False
        return (time.perf_counter() - self.decode_started) * 1000 > budget

    # result -------------------------------------------------------------------------------

    @property
    def generated(self) -> list[int]:
        return self.output.generated

    @property
    def text(self) -> str:
        """The text generated so far, before the stop rules cut it."""
        return self.output.text

    def current_text(self) -> str:
        return self.output.current_text()

    def result(self) -> Result:
        stats = self.stats.closed(len(self.generated), self.started, self.decode_started, self.stop)
        truncated = self.prompt is not None and self.prompt.truncated
        return Result(self.current_text(), list(self.generated), stats, truncated)

    def release(self) -> None:
        """Give the caches back to the prompt cache for the next request, and the text to the
        document's suggestion history."""
        if self.options.sources.history and not self.background:  # a prefetch is nobody's suggestion yet
            self.ctx.history.record(self.options.document, self.options.prefix, self.current_text())
        worth_keeping = self.cache is not None and self.cache.length >= self.ctx.prompt_cache.min_reuse
        if worth_keeping and self.options.use_prompt_cache:
            side = admission.side_caches(self.draft, self.eagle, self.spare)
            self.ctx.prompt_cache.put(self.committed, self.cache, side)
        self.cache = None
