"""Finding the unit under the cursor and ranking the continuations the index knows for it."""

import re
from dataclasses import dataclass
from math import log1p

from prefixcache import grammars

# The trailing chain of names under the cursor: `self.client.ge`, `a::b`, `p->fi`, `redis_cl`.
_TRAILING_CHAIN = re.compile(r"[A-Za-z_$][\w$]*(?:\s*(?:\.|::|->)\s*[A-Za-z_$]?[\w$]*)*$")
_SEPARATOR = re.compile(r"\.|::|->")
MAX_TAIL_PARSE = 400  # characters of the cursor line given to tree-sitter
PER_PARTIAL = 24  # candidates read per partial unit from the full trie
PER_TIER = 12  # and from each tier of frequent units


@dataclass(frozen=True)
class Candidate:
    text: str  # the continuation only, never what is already typed
    score: float
    source: str | None  # the file it was taken from (repository-relative), when known


def cursor_context(text_before_cursor: str):
    """(typed part of the cursor line after its indentation, previous non-empty line stripped)."""
    cut = text_before_cursor.rfind("\n")
    line = text_before_cursor[cut + 1 :]
    typed = line.lstrip()
    previous = None
    end = cut
    while end > 0:
        start = text_before_cursor.rfind("\n", 0, end) + 1
        candidate = text_before_cursor[start:end].strip()
        if candidate:
            previous = candidate
            break
        end = start - 1
    return typed, previous


def unit_starts(typed: str, path: str | None) -> list[int]:
    """Offsets in `typed` where the unit under the cursor may start, outermost first."""
    starts = {0}
    match = _TRAILING_CHAIN.search(typed)
    if match:
        starts.add(match.start())
        for sep in _SEPARATOR.finditer(typed, match.start()):
            starts.add(sep.end())
    language = grammars.language_for(path) if path else None
    if language is not None and typed and len(typed) <= MAX_TAIL_PARSE:
        starts.update(_tree_starts(language, typed))
    return sorted(s for s in starts if s < len(typed) or s == 0)


def _tree_starts(language: str, typed: str):
    """Starts of the syntax nodes (calls, member chains) that end at the cursor."""
    source = typed.encode()
    try:
        tree = grammars.parser(language).parse(source)
        found = grammars.captures(language, tree.root_node).get("unit", ())
    except (ValueError, RuntimeError):
        return ()
    if not typed.isascii():
        return ()  # byte offsets would not be character offsets; the regex starts suffice
    return [n.start_byte for n in found if n.end_byte == len(source)]


def rank(entries, path: str | None, k: int) -> list[Candidate]:
    """entries: (continuation, count, source, weight) -> the k best distinct continuations."""
    directory = path.rsplit("/", 1)[0] if path and "/" in path else ""
    best = {}
    for text, count, source, weight in entries:
        if not text or count <= 0:
            continue
        locality = 1.0
        if source is not None and path is not None:
            if source == path:
                locality = 3.0
            elif directory and source.startswith(directory + "/") or (not directory and "/" not in source):
                locality = 1.5
        score = weight * (1.0 + log1p(count)) * locality
        old = best.get(text)
        if old is None or score > old[0]:
            best[text] = (score, source)
    top = sorted(best.items(), key=lambda item: (-item[1][0], item[0]))[:k]
    return [Candidate(text, score, source) for text, (score, source) in top]
