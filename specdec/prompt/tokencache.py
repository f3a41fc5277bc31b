"""Tokenizing the prompt's pieces once: an editor sends the same suffix, the same context chunks
and the same lines above the cursor keystroke after keystroke.

A fast tokenizer takes about half a microsecond a character on this kind of CPU, and a prompt's
suffix, chunks and prefix run to tens of thousands of characters: tokenizing them again on every
keystroke cost more than a whole short completion's decoding. So whole pieces are remembered
(suffix, chunks), and the text before the cursor is split where the tokenizer itself always
splits, before the newline that ends the line above the cursor: the lines above are remembered,
and only the line being typed is tokenized again.

Whether a tokenizer always splits there is checked once, on a sample of code with every kind of
line end, against tokenizing the sample whole: a pre-tokenizer that joins a newline to what
precedes it (Qwen2's and Llama 3's join punctuation to the newlines after it; sentencepiece marks
a text's first word) fails the check, and its prefixes are then tokenized whole (and remembered
whole). The prompt's tokens never depend on the cache.
"""

import threading
from collections import OrderedDict

MAX_HELD_TOKENS = 400_000  # over all remembered pieces (about 150 bytes a token with offsets); LRU
SPLIT_SEARCH_LINES = 8  # newlines tried back from the cursor for one that the tokenizer splits before

_SAMPLE = (
    "import os\n\nclass Store(Base):\n    \"\"\"Keeps rows.\"\"\"\n\n    def get(self, key: str) -> dict:\n"
    "        value = self.rows.get(key, {})  # a comment\n        if not value:\n            return {}\n"
    "        return {k: v for k, v in value.items()}\n\n\n    def put(self, key, value=None):\n"
    "        self.rows[key] = [1, 2, 3]\n        total = 12345\n        s = 'it''s'\n"
    "        print(f\"{key}: {value!r}\")\n\tindented_with_tab = True\n"
    "fn main() -> Result<(), Error> {\n    let x = vec![1, 2];\n    x.iter().map(|v| v * 2);\n}\n"
    "const f = (a, b) => a + b;\nx = y;\n// done\n<div class=\"a\">\u00e9t\u00e9</div>\nend\n"
)


class TokenCache:
    """(ids, offsets) of texts, as tokenizer.encode gives them (as tuples: what the cache hands
    out is shared), remembered in an LRU."""

    def __init__(self, tokenizer, max_tokens: int = MAX_HELD_TOKENS):
        self.tokenizer, self.max_tokens = tokenizer, max_tokens
        self._held: OrderedDict = OrderedDict()  # text -> (ids, offsets)
        self._tokens = 0
        self._lock = threading.Lock()
        self.splits_before_newlines = self._splits_before_newlines(_SAMPLE)

    def encode(self, text: str) -> tuple[tuple, tuple]:
        """(ids, offsets) of `text`, tokenized once while it stays in the cache."""
        with self._lock:
            found = self._held.get(text)
            if found is not None:
                self._held.move_to_end(text)
                return found
        found = self._tokenized(text)
        with self._lock:
            if text not in self._held:
                self._held[text] = found
                self._tokens += len(found[0])
                while self._tokens > self.max_tokens and len(self._held) > 1:
                    _, (ids, _) = self._held.popitem(last=False)
                    self._tokens -= len(ids)
        return found

    def encode_before_cursor(self, text: str) -> tuple[tuple, tuple]:
        """(ids, offsets) of the text before the cursor: the lines above it from the cache,
        the line being typed tokenized now; both exactly what tokenizing `text` whole gives."""
        split = self._split_point(text) if self.splits_before_newlines else -1
        if split <= 0:
            return self.encode(text)
        return self._joined(self.encode(text[:split]), text, split)

    def encode_head(self, text: str, at_least: int) -> tuple[tuple, tuple] | None:
        """(ids, offsets) of the lines of `text` up to the first split point at or after
        `at_least` characters: exactly the first tokens of tokenizing `text` whole. None where
        there is no such point (a shorter text, or a tokenizer that does not split there)."""
        if not self.splits_before_newlines:
            return None
        newline = text.find("\n", max(at_least, 1))
        while newline > 0 and not _splits_before(text, newline):
            newline = text.find("\n", newline + 1)
        return self.encode(text[:newline]) if newline > 0 else None

    def _tokenized(self, text: str) -> tuple[tuple, tuple]:
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        return tuple(encoding.ids), tuple(encoding.offsets)

    def _joined(self, head: tuple[tuple, tuple], text: str, split: int) -> tuple[tuple, tuple]:
        """(ids, offsets) of `text` from `head`, those of text[:split], and text[split:] tokenized now."""
        tail_ids, tail_offsets = self._tokenized(text[split:])
        return head[0] + tail_ids, head[1] + tuple((a + split, b + split) for a, b in tail_offsets)

    @staticmethod
    def _split_point(text: str) -> int:
        """A newline near the end that follows a visible character, else -1."""
        end = len(text)
        for _ in range(SPLIT_SEARCH_LINES):
            newline = text.rfind("\n", 0, end)
            if newline <= 0:
                return -1
            if _splits_before(text, newline):
                return newline
            end = newline
        return -1

    def _splits_before_newlines(self, sample: str) -> bool:
        whole = self._tokenized(sample)
        splits = (i for i, c in enumerate(sample) if c == "\n" and _splits_before(sample, i))
        return all(self._joined(self._tokenized(sample[:split]), sample, split) == whole for split in splits)


def _splits_before(text: str, newline: int) -> bool:
    """The split rule the check verifies: a newline that follows a visible character."""
    return newline > 0 and not text[newline - 1].isspace()
