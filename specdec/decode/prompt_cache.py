"""PromptCache: KV caches of recent requests, reused for the longest common token prefix.

An entry holds the target's (and the draft's) cache for a token sequence. A new request takes
the entry sharing the longest prefix with its prompt (so one more keystroke prefills only the
new tokens), and puts its own caches back when it finishes. Bounded in bytes, LRU eviction.

When the match is only the head of the entry (another document after the same repository
context, or the same file's head before a far jump), the request gets a copy of that head and
the entry stays: taking it would make the entry's own document prefill its whole file again on
its next keystroke, and copying a cache's head costs a small fraction of prefilling it.
"""

import threading
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class SideCaches:
    """What a request keeps beside the target's cache: the draft's cache (holding a prefix of
    draft_tokens), and for an EAGLE-3 head the target's captured features [n, k*H] and the head's
    cache, which holds its first head_synced pairs."""

    draft: object | None = None
    draft_tokens: list = field(default_factory=list)
    features: object = None
    head: object = None
    head_synced: int = 0


@dataclass(eq=False)  # identity, not element-wise array comparison
class CacheEntry:
    tokens: np.ndarray  # int64 [n]: the sequence the target cache holds
    target: object  # KVCache
    draft: object | None  # KVCache of the draft, holding a prefix of draft_tokens
    draft_tokens: list = field(default_factory=list)
    last_used: float = 0.0
    features: object = None  # [n, k*H] the target's captured hidden states, for an EAGLE-3 head
    head: object = None  # the head's KVCache, holding its first head_synced pairs
    head_synced: int = 0
    held_bytes: int = 0  # nbytes() when it was put: entries are not changed while the cache holds them

    def nbytes(self) -> int:
        extra = (self.draft.nbytes() if self.draft is not None else 0) + (self.head.nbytes() if self.head is not None else 0)
        return self.target.nbytes() + extra

    def kept_to(self, length: int) -> SideCaches:
        """This entry's side caches cut to the first `length` tokens (the target's tokens past them
        are replaced by a new request): features and head pairs of later tokens would be stale. The
        draft's cache names its own tokens and is rewound against the next request's."""
        features, head_synced = self.features, self.head_synced
        if features is not None:
            features = features[:length]
        if self.head is not None:
            head_synced = min(head_synced, max(0, length - 1))
            self.head.truncate(head_synced)
        return SideCaches(self.draft, self.draft_tokens, features, self.head, head_synced)

    def head_copy(self, length: int, capacity: int) -> "CacheEntry":
        """A new entry with copies of the caches' first `length` tokens."""
        draft, draft_tokens = None, []
        if self.draft is not None:
            draft_length = min(length, self.draft.length, len(self.draft_tokens))
            draft, draft_tokens = self.draft.clone(draft_length, capacity), self.draft_tokens[:draft_length]
        features = None if self.features is None else self.features[:length].clone()
        head, head_synced = None, 0
        if self.head is not None:
            head_synced = min(self.head_synced, max(0, length - 1))
            head = self.head.clone(head_synced, capacity)
        return CacheEntry(self.tokens[:length].copy(), self.target.clone(length, capacity), draft, draft_tokens,
                          features=features, head=head, head_synced=head_synced)


class PromptCache:
    def __init__(self, max_bytes: int = 512 << 20, min_reuse: int = 16, share_tail: int = 256):
        self.max_bytes = max_bytes
        self.min_reuse = min_reuse  # shorter matches are not worth taking an entry away
        # An entry holding more tokens than this (and a quarter of its length) past the match is
        # copied from, not taken: more than a keystroke's generated tail (up to n_predict tokens).
        self.share_tail = share_tail
        self.entries: list[CacheEntry] = []
        self.lock = threading.Lock()

    def take(self, prompt: list[int]):
        """(entry, common prefix length) of the best match, removed from the cache; or (None, 0)."""
        query = np.asarray(prompt, dtype=np.int64)
        with self.lock:
            best, best_len = None, 0
            for entry in self.entries:
                n = min(len(entry.tokens), len(query))
                if n <= best_len or (best_len and entry.tokens[best_len] != query[best_len]):
                    continue  # it cannot share more than the best so far: one token says so
                diff = np.flatnonzero(entry.tokens[:n] != query[:n])
                common = int(diff[0]) if diff.size else n
                if common > best_len:
                    best, best_len = entry, common
            if best is None or best_len < self.min_reuse:
                return None, 0
            if len(best.tokens) - best_len > max(self.share_tail, len(best.tokens) // 4):
                best.last_used = time.monotonic()
                return best.head_copy(best_len, len(query) + self.share_tail), best_len
            self.entries.remove(best)
            return best, best_len

    def put(self, tokens: list[int], target, side: SideCaches | None = None) -> None:
        side = side or SideCaches()
        entry = CacheEntry(np.asarray(tokens[: target.length], dtype=np.int64), target, side.draft,
                           list(side.draft_tokens), time.monotonic(), side.features, side.head, side.head_synced)
        entry.held_bytes = entry.nbytes()
        with self.lock:
            self.entries.append(entry)
            self._evict()

    def _evict(self) -> None:
        self.entries.sort(key=lambda e: e.last_used)
        held = self._bytes_held()
        while self.entries and held > self.max_bytes:
            held -= self.entries.pop(0).held_bytes

    def nbytes(self) -> tuple[int, int]:
        """(entries, bytes held): for the server's metrics."""
        with self.lock:
            return len(self.entries), self._bytes_held()

    def _bytes_held(self) -> int:
        """Summed from each entry's size at put: asking every cache its size again at each put
        cost about as much as a decode step once a few dozen entries were held."""
        return sum(e.held_bytes for e in self.entries)

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
