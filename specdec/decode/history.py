"""Suggestion history: the recent completions of each document, as a source of speculation.

An editor asks again and again around the same place: the user types the first characters of
the suggestion just shown, backspaces and retypes, accepts one line and continues, or the client
repeats a request. Each time the answer is very likely the rest of an earlier completion. So each
document keeps the text before the cursor and the completion of its recent requests, and at every
step the tail of the current text (the text before the cursor plus what has been generated) is
looked up in them, longest match first, as SuffixDecoding does with its suffix trees. The tail is
also looked up earlier in the current text itself (code repeats within a file).

Matching is on text, not tokens, so a tail typed by the user matches a completion the model
tokenized differently. The target verifies every proposal, so the output never changes.
"""

import threading
from collections import OrderedDict, deque
from typing import NamedTuple

CONTEXT_CHARS = 600  # of text before the cursor kept with each completion
MATCH_LENGTHS = (48, 24, 12)  # characters of tail tried, longest first
MIN_CONTINUATION = 2
SELF_SEARCH_CHARS = 20_000  # of the current text searched for an earlier occurrence of its tail


class Suggestion(NamedTuple):
    """A completion with the text before its cursor: text = context + completion."""

    text: str
    start: int  # where the completion begins in text

    def find_along(self, tail: str) -> int:
        """Where `tail` lies along the suggestion: its first occurrence that ends at or after the
        completion's start (the user types along it from there, or repeats the request), else
        -1. Not the last occurrence: in repetitive code (a run of `str, str, ...`) that left a
        few characters to propose."""
        return self.text.find(tail, max(0, self.start - len(tail)))


class SuggestionHistory:
    def __init__(self, per_document: int = 8, max_documents: int = 256):
        self.per_document, self.max_documents = per_document, max_documents
        self._texts: OrderedDict = OrderedDict()  # document -> deque of Suggestions, newest last
        self._lock = threading.Lock()

    def record(self, document: str | None, text_before_cursor: str, completion: str) -> None:
        """Keep a finished (or superseded) completion with the text that led to it."""
        if not completion.strip():
            return
        with self._lock:
            texts = self._texts.get(document)
            if texts is None:
                texts = self._texts[document] = deque(maxlen=self.per_document)
                while len(self._texts) > self.max_documents:
                    self._texts.popitem(last=False)
            self._texts.move_to_end(document)
            context = text_before_cursor[-CONTEXT_CHARS:]
            texts.append(Suggestion(context + completion, len(context)))

    def typing_along(self, document: str | None, text: str, generated: str = "", length: int = MATCH_LENGTHS[0]) -> bool:
        """Whether the tail of text + generated lies inside a stored suggestion with more of it to
        come: the user is typing along (or generation is running along) something already suggested.
        (Only the tail is joined: this runs at every step the policy would decode plainly.)"""
        with self._lock:
            stored = list(self._texts.get(document, ()))
        tail = (text[-length:] + generated)[-length:] if stored else ""
        if len(tail) < length:
            return False
        return any(0 <= s.find_along(tail) < len(s.text) - length - MIN_CONTINUATION for s in stored)

    def forget(self, document: str | None) -> None:
        with self._lock:
            self._texts.pop(document, None)

    def continuations(self, document: str | None, text: str, k: int = 3, max_chars: int = 320, lengths=None,
                      after: str = "") -> list:
        """Up to k distinct (continuation, from_suggestion) that followed the tail of `text`
        before, best first: the longest matching tail, then the most recent history, then the
        text itself, then `after`, the text after the cursor (from_suggestion False: code
        repeating within the file, which the target follows far less often than the rest of a
        suggestion it made itself). The text after the cursor is where a file's next similar
        line often already stands (the next branch, the next field): it catches points that
        neither the text before the cursor nor the repository's trie does."""
        with self._lock:
            stored = list(reversed(self._texts.get(document, ())))
        own = text[-SELF_SEARCH_CHARS:-1]
        after = after[:SELF_SEARCH_CHARS]
        lengths = lengths or MATCH_LENGTHS
        # Most steps find nothing: a longer tail ends with the shortest one, so where the
        # shortest occurs nowhere, no longer tail does either (one search of the text, not one a length).
        probe = text[-min(lengths) :]
        if (len(probe) == min(lengths) and own.rfind(probe) < 0 and after.find(probe) < 0
                and all(s.find_along(probe) < 0 for s in stored)):
            return []
        sources = [(s.text, s.find_along, True) for s in stored] + [(own, own.rfind, False), (after, after.find, False)]
        found, seen = [], set()
        for length in lengths:
            if len(text) < length:
                continue
            tail = text[-length:]
            for body, find, from_suggestion in sources:
                at = find(tail)
                if at < 0:
                    continue
                continuation = body[at + length : at + length + max_chars]
                if len(continuation) >= MIN_CONTINUATION and continuation not in seen:
                    seen.add(continuation)
                    found.append((continuation, from_suggestion))
                    if len(found) >= k:
                        return found
            if found:
                return found
        return found
