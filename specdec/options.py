"""CompletionOptions: what one completion request asks for, validated once where it is made.

The HTTP schemas, the CLI and Engine.complete all build this one carrier; everything after it
(the scheduler, the generation, the stop rules) reads its fields and never re-checks them.
"""

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Strategy:
    """Which sources a strategy speculates with. Everything that differs between strategies
    reads these flags, never the strategy's name."""

    name: str
    trie: bool = False  # the repository's prefix cache
    history: bool = False  # the document's earlier suggestions and the text's own repeats; its answers join them
    ngram: bool = False  # n-grams of the sequence so far
    draft: bool = False  # the draft model, or the target's EAGLE-3 head where one is loaded

    @property
    def speculates(self) -> bool:
        """False for the plain decoding every other strategy must equal token for token."""
        return self.trie or self.history or self.ngram or self.draft


STRATEGY_TABLE = {s.name: s for s in (
    Strategy("ar"), Strategy("draft", draft=True), Strategy("ngram", ngram=True), Strategy("trie", trie=True),
    Strategy("hybrid", trie=True, history=True, draft=True))}
STRATEGIES = tuple(STRATEGY_TABLE)
PLAIN = next(name for name, s in STRATEGY_TABLE.items() if not s.speculates)  # the reference: plain decoding
DEFAULT_STRATEGY = "hybrid"  # every source
MODES = ("auto", "single", "multi")
CONTEXTS = ("auto", "none")
FIM_MODES = ("psm", "spm", "suffix_first")


class OptionsError(ValueError):
    """An option out of its range; the message names the option, and `field` does where a
    caller needs it apart (an HTTP error's param)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class CompletionOptions:
    prefix: str
    suffix: str = ""
    max_tokens: int = 64
    temperature: float = 0.0  # 0 is greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 keeps every token
    strategy: str = DEFAULT_STRATEGY  # one of STRATEGIES
    mode: str = "auto"  # single: stop at the end of the line; multi: a block; auto: single when text follows
    path: str | None = None  # repository-relative, POSIX style
    extra: tuple = ()  # ((filename, text), ...) context chunks, most relevant last
    seed: int = 0  # the uniforms of sampling: the same seed gives the same tokens
    n_indent: int | None = None  # llama.cpp's n_indent: a multi-line completion ends below this indentation
    stop: tuple = ()  # stop strings; the output ends before the first one found
    # A strict time budget for prediction: the completion stops at it with what it has.
    time_budget_ms: float | None = None
    time_budget_after_newline: bool = False  # llama.cpp's rule instead: stop only after a newline
    # How long the client waits for prediction to start (llama.cpp's t_max_prompt_ms); with a
    # strict time budget it defaults to that. A request whose wait would be longer is answered at once, empty.
    wait_budget_ms: float | None = None
    use_prompt_cache: bool = True
    document: str | None = None  # requests for the same document supersede each other
    slot: str | None = None  # and so do requests for the same client slot (llama.cpp's id_slot)
    context: str = "auto"  # auto: retrieve repository context when an index is attached; none: only `extra`
    fim_mode: str | None = None  # the prompt's order for this request; None: the engine's (checked against its family at submit)
    ignore_eos: bool = False  # llama.cpp's: end-of-generation tokens are never picked (other stop rules apply)
    prefetch: bool = True  # once answered, compute the next request after an accept while idle (specdec.decode.prefetch)

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise OptionsError(f"strategy {self.strategy!r}: expected one of {', '.join(STRATEGIES)}")
        if self.mode not in MODES:
            raise OptionsError(f"mode {self.mode!r}: expected one of {', '.join(MODES)}")
        if self.context not in CONTEXTS:
            raise OptionsError(f"context {self.context!r}: expected one of {', '.join(CONTEXTS)}")
        if self.fim_mode is not None and self.fim_mode not in FIM_MODES:
            raise OptionsError(f"fim_mode {self.fim_mode!r}: expected one of {', '.join(FIM_MODES)}")
        for name in ("time_budget_ms", "wait_budget_ms"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise OptionsError(f"{name} must be > 0")
        if self.max_tokens < 0:
            raise OptionsError("max_tokens must be >= 0")
        if self.temperature < 0:
            raise OptionsError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise OptionsError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise OptionsError("top_k must be >= 0")
        if not isinstance(self.extra, tuple) or not isinstance(self.stop, tuple):
            object.__setattr__(self, "extra", tuple(self.extra))
            object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def sources(self) -> Strategy:
        """The strategy's sources (STRATEGY_TABLE)."""
        return STRATEGY_TABLE[self.strategy]

    @property
    def client_wait_ms(self) -> float | None:
        """How long the client waits for prediction to start (its t_max_prompt_ms, else its strict
        prediction budget); None: no bound, and a request generating nothing (llama.vim's cache
        warming) has none."""
        if self.max_tokens == 0:
            return None
        return self.wait_budget_ms if self.wait_budget_ms is not None else self.strict_budget_ms

    @property
    def strict_budget_ms(self) -> float | None:
        """The time budget when it is kept strictly (not llama.cpp's after-a-newline rule)."""
        return None if self.time_budget_after_newline else self.time_budget_ms

    def with_changes(self, **changes) -> "CompletionOptions":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)
