"""Similar code by token-set overlap: the cheap ranking of RepoCoder, Tabby and llama.vim's chunk picking.

A window is a run of whole lines; its key is the set of identifiers and keywords it holds. The
query is the text around the cursor. Ranking is Jaccard similarity of the two sets, so a window
that shares the cursor's names ranks first whatever its length.
"""

import re
from typing import NamedTuple

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
WINDOW_LINES = 24
WINDOW_STRIDE = 12


class Window(NamedTuple):
    """Lines [start, end) of a file's text (0-based), the text itself, and its word set."""

    path: str
    start: int
    end: int
    text: str
    words: frozenset


def words(text: str) -> frozenset:
    return frozenset(_WORD.findall(text))


def jaccard(a: frozenset, b: frozenset) -> float:
    if not a or not b:
        return 0.0
    shared = len(a & b)
    return shared / (len(a) + len(b) - shared)


def windows(path: str, text: str, lines: int = WINDOW_LINES, stride: int = WINDOW_STRIDE) -> list[Window]:
    """Overlapping windows of `lines` lines every `stride` lines (a short file is one window)."""
    rows = text.split("\n")
    out = []
    for start in range(0, max(1, len(rows) - lines + stride), stride):
        end = min(len(rows), start + lines)
        chunk = "\n".join(rows[start:end])
        if chunk.strip():
            out.append(Window(path, start, end, chunk, words(chunk)))
        if end == len(rows):
            break
    return out


def most_similar(query: str, candidates, k: int, min_score: float = 0.0) -> list[tuple[float, Window]]:
    """The k windows most similar to the query, best first, as (score, window)."""
    key = words(query)
    scored = [(jaccard(key, w.words), w) for w in candidates]
    scored = [s for s in scored if s[0] > min_score]
    scored.sort(key=lambda s: (-s[0], s[1].path, s[1].start))
    return scored[:k]
