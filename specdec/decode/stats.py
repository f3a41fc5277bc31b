"""Stats: the statistics of one finished completion, the keys of the public contract as fields.

It reads as a mapping too (`result.stats["tau"]`, `dict(result.stats)`), which is what the public
API promised before it was typed; as_dict() gives plain JSON-ready values.
"""

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

SOURCES = ("trie", "draft", "ngram", "history", "bonus")
REPORTED_AS = {"suggestion": "history"}  # sources learned apart but reported as one


def _by_source() -> dict:
    return dict.fromkeys(SOURCES, 0)


@dataclass
class Stats(Mapping):
    target_passes: int = 0  # target forwards after prefill
    generated_tokens: int = 0
    tau: float = 0.0  # generated_tokens / target_passes
    accepted_by_source: dict = field(default_factory=_by_source)  # tokens kept, by who proposed them
    prefill_tokens: int = 0  # prompt tokens computed for this request
    cached_tokens: int = 0  # prompt tokens reused from the prompt cache
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    total_ms: float = 0.0
    stop_reason: str = "none"  # eos, newline, dedent, suffix, repeat, word, limit, time, busy, cancelled, superseded, error
    stop_word: str = ""  # the stop string that matched, when stop_reason is "word"
    tree_nodes: int = 0  # speculated nodes verified, all passes together
    draft_steps: int = 0  # passes whose tree the draft model or EAGLE-3 head drafted for
    experts_woken: int = 0  # distinct experts of the passes this request rode in, over layers and passes
    context_chunks: int = 0  # repository chunks in the prompt (retrieved and the client's)
    context_tokens: int = 0
    retrieval_ms: float = 0.0
    tokens_cap: int = 0  # the scheduler's cap on generated tokens under load (0: the request's own limit)
    expected_wait_ms: float = 0.0  # with stop_reason "busy": the wait that was longer than the budget
    prefetched: str = ""  # "served": answered from a finished prefetch; "joined": continued a running one

    def __getitem__(self, key):
        if key not in _FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)

    def as_dict(self) -> dict:
        return asdict(self)

    def count_pass(self, accepted_sources: list) -> None:
        """One target pass: the sources of the tokens it accepted, and its own bonus token."""
        self.target_passes += 1
        for source in accepted_sources:
            reported = REPORTED_AS.get(source, source)
            self.accepted_by_source[reported] = self.accepted_by_source.get(reported, 0) + 1
        self.accepted_by_source["bonus"] += 1

    def closed(self, generated: int, started: float, decode_started: float | None, stop) -> "Stats":
        """A copy completed at the end of a request (times from perf_counter; stop: a StopCut)."""
        now = time.perf_counter()
        done = Stats(**self.as_dict())
        done.generated_tokens = generated
        done.tau = generated / done.target_passes if done.target_passes else 0.0
        done.decode_ms = (now - decode_started) * 1000 if decode_started else 0.0
        done.total_ms = (now - started) * 1000
        done.stop_reason, done.stop_word = stop.reason or "none", stop.matched
        return done


_FIELDS = tuple(f.name for f in fields(Stats))


@dataclass
class Result:
    """What a finished request returns."""

    text: str
    tokens: list
    stats: Stats = field(default_factory=Stats)
    truncated: bool = False  # the prompt (context or prefix) was cut to fit the model
