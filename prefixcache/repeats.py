"""Repeats: where the tail of the text before the cursor occurs in the repository's other files,
and what followed it there, most frequent first (a SuffixDecoding-style source of speculation).

The trie proposes units that start where the cursor's unit starts; code also repeats from the
middle of a line on (an argument list, a call chain, the rest of a statement another file
spells the same way). The file under the cursor is searched by the suggestion history; this
searches the rest of the repository.

Every position of the files' UTF-8 bytes is hashed over its next GRAM bytes, and the hashes
are kept sorted with their positions: a lookup is one binary search for the tail's last GRAM
bytes, then a comparison of the longer tails at the few positions found. A file changed since
the build is left out of that array and searched in its current text instead.
"""

import threading

import numpy as np

GRAM = 12  # bytes hashed per position: the shortest tail looked up
TAILS = (48, 24, GRAM)  # tail lengths in bytes, longest first
PRIME = 1099511628211  # FNV-1a's 64-bit prime: a multiplier with well-mixed bits
MASK = (1 << 64) - 1
MAX_BYTES = 8 << 20  # of file text hashed (12 bytes of arrays a byte); files past it are left out
CANDIDATES = 256  # positions compared per lookup: a common tail (indentation) matches thousands
SEPARATOR = b"\0"


def gram_hash(data: bytes) -> int:
    """The hash of GRAM bytes, as the array's vectorised loop computes it."""
    h = 0
    for byte in data:
        h = (h * PRIME + byte) & MASK
    return h


def _hashes(corpus: np.ndarray) -> np.ndarray:
    count = len(corpus) - GRAM + 1
    h = np.zeros(max(0, count), dtype=np.uint64)
    if count <= 0:
        return h
    prime = np.uint64(PRIME)
    with np.errstate(over="ignore"):
        for k in range(GRAM):
            h = h * prime + corpus[k : k + count].astype(np.uint64)
    return h


class Repeats:
    """The repository's files, searchable by the tail of a text."""

    def __init__(self, texts: dict[str, str], max_bytes: int = MAX_BYTES):
        paths, parts, size = [], [], 0
        for path, text in texts.items():
            data = text.encode("utf-8", errors="replace")
            if size + len(data) + 1 > max_bytes:
                continue
            paths.append(path)
            parts.append(data)
            size += len(data) + 1
        self.paths = paths
        self.corpus = SEPARATOR.join(parts) + SEPARATOR
        starts = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) + 1 for p in parts], out=starts[1:])
        self.starts = starts  # file i spans corpus[starts[i] : starts[i + 1] - 1]
        hashes = _hashes(np.frombuffer(self.corpus, dtype=np.uint8))
        self.order = np.argsort(hashes, kind="stable").astype(np.uint32)
        self.sorted = hashes[self.order]
        self.number = {path: i for i, path in enumerate(paths)}
        self.changed: dict[str, bytes] = {}  # path -> its current text, for files changed since the build
        self.lock = threading.Lock()

    def update(self, path: str, text: str | None) -> None:
        """A file's new text (None: removed). A file that is again what was built is searched in
        the array again."""
        data = None if text is None else text.encode("utf-8", errors="replace")
        with self.lock:
            i = self.number.get(path)
            if i is not None and data == self.corpus[self.starts[i] : self.starts[i + 1] - 1]:
                self.changed.pop(path, None)
            else:
                self.changed[path] = data if data is not None else b""

    def continuations(self, text: str, path: str | None = None, k: int = 3, chars: int = 320) -> list[str]:
        """Up to k continuations of the longest tail of `text` found in the files other than
        `path`, grouped by their first line and the most frequent first."""
        tail = text[-TAILS[0] :].encode("utf-8", errors="replace")
        if len(tail) < GRAM or not tail[-GRAM:].strip():
            return []  # a line's indentation matches everywhere: where a unit starts is the trie's
        with self.lock:
            changed = dict(self.changed)
        key = np.uint64(gram_hash(tail[-GRAM:]))
        at = int(np.searchsorted(self.sorted, key, side="left"))
        positions = self.order[at : at + CANDIDATES]
        positions = positions[self.sorted[at : at + len(positions)] == key]
        for length in TAILS:
            if len(tail) < length:
                continue
            found = self._in_array(tail[-length:], positions, changed, path, chars)
            found += _in_texts(tail[-length:], changed, path, chars)
            if found:
                return _ranked(found, k)
        return []

    def _in_array(self, tail: bytes, positions, changed: dict, path: str | None, chars: int) -> list[bytes]:
        corpus, length, found = self.corpus, len(tail), []
        for p in positions.tolist():
            end = p + GRAM  # the tail ends where the gram does
            if end - length < 0 or corpus[end - length : end] != tail:
                continue
            i = int(np.searchsorted(self.starts, p, side="right")) - 1
            name = self.paths[i]
            if name == path or name in changed:
                continue
            stop = int(self.starts[i + 1]) - 1
            found.append(corpus[end : min(stop, end + chars)])
        return found


def _in_texts(tail: bytes, changed: dict, path: str | None, chars: int) -> list[bytes]:
    found = []
    for name, data in changed.items():
        if name == path:
            continue
        at = data.find(tail)
        while at >= 0 and len(found) < CANDIDATES:
            found.append(data[at + len(tail) : at + len(tail) + chars])
            at = data.find(tail, at + 1)
    return found


def _ranked(found: list[bytes], k: int) -> list[str]:
    """The most frequent first lines' continuations, each the first seen of its line."""
    counts, whole = {}, {}
    for follow in found:
        text = follow.decode("utf-8", errors="ignore")
        line = text.split("\n", 1)[0]
        if not text or (not line and len(text) < 2):
            continue
        counts[line] = counts.get(line, 0) + 1
        whole.setdefault(line, text)
    ranked = sorted(counts, key=lambda line: -counts[line])
    return [whole[line] for line in ranked[:k]]
