"""Retrieval: the repository's code most useful in the prompt at a cursor, packed into a budget.

Four kinds of chunk, each a run of whole lines of another file:
- definition: the signature and first lines of a class or function whose name is used near the
  cursor, found by tree-sitter; names the cursor's file imports from a repository module first;
- similar: windows most similar to the cursor's neighbourhood by token-set Jaccard (RepoCoder,
  Tabby and llama.vim pick chunks so), through an inverted index of the words that are rare
  enough to tell windows apart; each is cut to the line most like the cursor's last lines and
  the few after it, the code a model can copy next, and ranks above definitions;
- recent: the region around the latest edits of other files (from Index.update);
- candidate: the lines the trie's top candidates were taken from.
Chunks almost identical to the cursor's own neighbourhood are dropped (they make a model repeat
the code around the cursor), and so are overlaps with a chunk already chosen.
"""

import re
import threading
from collections import deque
from dataclasses import dataclass

from prefixcache import grammars
from prefixcache.similar import Window, jaccard, windows, words

NEIGHBOURHOOD_LINES = 12  # before the cursor (and a third of it after) make the query
NEAR_DUPLICATE = 0.5  # Jaccard with the neighbourhood above which a chunk is dropped
DEFINITION_LINES = 12
COMMON_WORD_SHARE = 0.05  # words in more windows than this share are not looked up
SIMILAR_FLOOR = 0.3  # Jaccard with the neighbourhood a similar window needs to be chosen at all
# A similar window is cut to its line most like the cursor's last ANCHOR_LINES lines, with
# SIMILAR_BEFORE lines before it and SIMILAR_AFTER after: a whole 24-line window fits no small
# budget, and what follows the matching line is what the completion may repeat.
ANCHOR_LINES = 3
SIMILAR_BEFORE = 1
SIMILAR_AFTER = 3
SIMILAR_RANK = 3.0  # added to a similar chunk's Jaccard, above any definition's score
_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", re.MULTILINE)
_DEFINITION_NODES = {
    "python": ("function_definition", "class_definition"),
    "javascript": ("function_declaration", "class_declaration", "method_definition"),
    "typescript": ("function_declaration", "class_declaration", "method_definition", "interface_declaration"),
    "tsx": ("function_declaration", "class_declaration", "method_definition", "interface_declaration"),
    "go": ("function_declaration", "method_declaration", "type_spec"),
    "rust": ("function_item", "struct_item", "enum_item", "trait_item"),
    "java": ("method_declaration", "class_declaration", "interface_declaration"),
}


@dataclass(frozen=True)
class Chunk:
    path: str
    start: int  # first line, 0-based
    end: int  # one past the last line
    text: str
    kind: str  # definition | similar | recent | candidate
    score: float


@dataclass(frozen=True)
class Definition:
    name: str
    path: str
    start: int
    end: int


class Retriever:
    """Windows and definitions of every file, kept in step with the index's updates."""

    def __init__(self, max_recent: int = 8):
        self.texts: dict[str, list[str]] = {}  # path -> lines
        self.windows: dict[str, list[Window]] = {}
        self.definitions: dict[str, list[Definition]] = {}  # name -> definitions
        self.names_of: dict[str, set] = {}  # path -> names it defines (what remove() must visit)
        self.paths_by_tail: dict[str, set] = {}  # "b/c.py" -> {"b/c.py", "a/b/c.py", ...}: what an import names
        self.postings: dict[str, set] = {}  # word -> {(path, window number)}
        self.recent = deque(maxlen=max_recent)  # (path, start, end) of the latest edits
        self.window_count = 0
        self.updates: dict[str, int] = {}  # path -> updates seen (what a stable context depends on)
        self.total_updates = 0
        self.lock = threading.RLock()

    # keeping up with the repository ---------------------------------------------------------

    def update(self, path: str, text: str, edited: bool = True) -> None:
        with self.lock:
            old = self.texts.get(path)
            self.remove(path)
            lines = text.split("\n")
            self.texts[path] = lines
            for tail in _tails(path):
                self.paths_by_tail.setdefault(tail, set()).add(path)
            self.windows[path] = windows(path, text)
            self.window_count += len(self.windows[path])
            self.updates[path] = self.updates.get(path, 0) + 1
            self.total_updates += 1
            for number, window in enumerate(self.windows[path]):
                for word in window.words:
                    self.postings.setdefault(word, set()).add((path, number))
            for definition in _definitions(path, text):
                self.definitions.setdefault(definition.name, []).append(definition)
                self.names_of.setdefault(path, set()).add(definition.name)
            if edited and old is not None:
                start, end = _changed_lines(old, lines)
                if start < end:
                    self.recent.append((path, start, end))

    def remove(self, path: str) -> None:
        with self.lock:
            gone = self.windows.pop(path, ())
            self.window_count -= len(gone)
            for number, window in enumerate(gone):
                for word in window.words:
                    self.postings.get(word, set()).discard((path, number))
            for name in self.names_of.pop(path, ()):
                kept = [d for d in self.definitions[name] if d.path != path]
                if kept:
                    self.definitions[name] = kept
                else:
                    del self.definitions[name]
            if self.texts.pop(path, None) is not None:
                for tail in _tails(path):
                    holders = self.paths_by_tail[tail]
                    holders.discard(path)
                    if not holders:
                        del self.paths_by_tail[tail]

    def generation(self, excluding: str | None = None) -> int:
        """Updates of files other than `excluding`: a context stays valid while this stays put."""
        with self.lock:
            return self.total_updates - self.updates.get(excluding, 0)

    # retrieving -----------------------------------------------------------------------------

    def retrieve(self, before: str, after: str, path: str | None, budget_chars: int,
                 candidates=(), min_similarity: float = SIMILAR_FLOOR) -> list[Chunk]:
        """Chunks for a cursor, most relevant last (nearest the file), within budget_chars;
        similar windows only from min_similarity (Jaccard with the neighbourhood) up."""
        if budget_chars <= 0:
            return []
        before_lines = before.split("\n")
        neighbourhood = "\n".join(before_lines[-NEIGHBOURHOOD_LINES:] + after.split("\n")[: NEIGHBOURHOOD_LINES // 3])
        near = words(neighbourhood)
        tail = words("\n".join(before_lines[-ANCHOR_LINES:]))
        with self.lock:
            found = (self._definitions_used(before_lines, path) + self._similar(near, tail, path, min_similarity)
                     + self._recent(path) + self._candidate_lines(candidates, path))
        return _pack(found, near, budget_chars)

    def _definitions_used(self, before_lines: list[str], path: str | None) -> list[Chunk]:
        names = words("\n".join(before_lines[-NEIGHBOURHOOD_LINES:]))
        imported = _imported_paths("\n".join(before_lines), self.paths_by_tail)
        chunks = []
        for name in sorted(names):  # a set's order changes from process to process (string hashing)
            for d in self.definitions.get(name, ())[:4]:
                if d.path == path:
                    continue
                score = 1.5 + (1.0 if d.path in imported else 0.0) + min(len(name), 20) / 40
                chunks.append(self._chunk(d.path, d.start, min(d.end, d.start + DEFINITION_LINES), "definition", score))
        return chunks

    def _similar(self, near: frozenset, tail: frozenset, path: str | None, floor: float, k: int = 4) -> list[Chunk]:
        limit = max(8, COMMON_WORD_SHARE * self.window_count)
        shared = {}
        for word in near:
            posting = self.postings.get(word, ())
            if len(posting) <= limit:
                for key in posting:
                    if key[0] != path:
                        shared[key] = shared.get(key, 0) + 1
        best = sorted(shared, key=lambda key: (-shared[key], key))[: 8 * k]  # ties by place, not by hash order
        scored = sorted(((jaccard(near, self.windows[p][n].words), p, n) for p, n in best), reverse=True)[:k]
        chunks = []
        for score, p, n in scored:
            if score > floor:
                at = self._line_most_like(p, self.windows[p][n], tail)
                chunks.append(self._chunk(p, max(0, at - SIMILAR_BEFORE), at + 1 + SIMILAR_AFTER, "similar",
                                          SIMILAR_RANK + score))
        return chunks

    def _line_most_like(self, path: str, window: Window, tail: frozenset) -> int:
        """The window's line whose last ANCHOR_LINES lines share most with the cursor's (the first of equals)."""
        lines = self.texts[path]
        best, at = -1.0, window.start
        for row in range(window.start, window.end):
            score = jaccard(words("\n".join(lines[max(0, row - ANCHOR_LINES + 1): row + 1])), tail)
            if score > best:
                best, at = score, row
        return at

    def _recent(self, path: str | None) -> list[Chunk]:
        chunks = []
        for age, (p, start, end) in enumerate(reversed(self.recent)):
            if p != path and p in self.texts:
                chunks.append(self._chunk(p, max(0, start - 4), end + 4, "recent", 1.2 - 0.1 * age))
        return chunks[:2]

    def _candidate_lines(self, candidates, path: str | None) -> list[Chunk]:
        chunks = []
        for rank, (source, needle) in enumerate(candidates):
            lines = self.texts.get(source)
            if source == path or lines is None or not needle.strip():
                continue
            row = next((i for i, line in enumerate(lines) if needle in line), None)
            if row is not None:
                chunks.append(self._chunk(source, max(0, row - 3), row + 4, "candidate", 1.4 - 0.2 * rank))
        return chunks[:2]

    def _chunk(self, path: str, start: int, end: int, kind: str, score: float) -> Chunk:
        lines = self.texts[path]
        end = min(end, len(lines))
        return Chunk(path, start, end, "\n".join(lines[start:end]), kind, score)


def _pack(found: list[Chunk], near: frozenset, budget_chars: int) -> list[Chunk]:
    """Best first into the budget, skipping near-duplicates of the neighbourhood and overlaps."""
    chosen, used = [], 0
    for chunk in sorted(found, key=lambda c: (-c.score, c.path, c.start)):  # the same chunks in every process
        if not chunk.text.strip() or used + len(chunk.text) > budget_chars:
            continue
        if jaccard(words(chunk.text), near) > NEAR_DUPLICATE:
            continue
        if any(c.path == chunk.path and c.start < chunk.end and chunk.start < c.end for c in chosen):
            continue
        chosen.append(chunk)
        used += len(chunk.text)
    return chosen[::-1]


def _definitions(path: str, text: str) -> list[Definition]:
    language = grammars.language_for(path)
    kinds = _DEFINITION_NODES.get(language or "")
    if not kinds:
        return []
    tree = grammars.parser(language).parse(text.encode("utf-8", "surrogatepass"))
    out, stack = [], [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type in kinds:
            name = node.child_by_field_name("name")
            if name is not None:
                out.append(Definition(name.text.decode("utf-8", "replace"), path, node.start_point[0],
                                      node.end_point[0] + 1))
        stack.extend(node.children)
    return out


def _imported_paths(text: str, paths_by_tail: dict) -> set:
    """Repository files the text imports (Python's `from a.b import` / `import a.b`): looked up by
    their path's tail, where a scan of every path for each import took most of a retrieval."""
    found = set()
    for match in _IMPORT.finditer(text):
        module = (match.group(1) or match.group(2)).lstrip(".").replace(".", "/")
        for candidate in (f"{module}.py", f"{module}/__init__.py"):
            found.update(paths_by_tail.get(candidate, ()))
    return found


def _tails(path: str) -> list[str]:
    """"a/b/c.py" -> ["a/b/c.py", "b/c.py", "c.py"]: every import path that can name the file."""
    parts = path.split("/")
    return ["/".join(parts[i:]) for i in range(len(parts))]


def _changed_lines(old: list[str], new: list[str]) -> tuple[int, int]:
    """[start, end) of the new lines that differ from the old (common head and tail removed)."""
    start = 0
    while start < min(len(old), len(new)) and old[start] == new[start]:
        start += 1
    tail = 0
    while tail < min(len(old), len(new)) - start and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    return start, len(new) - tail
