"""Repository context for a prompt: the index's retrieved chunks, kept stable while the cursor
stays near the line they were chosen for.

The chunks sit at the front of the prompt, so a prompt whose context changed would be prefilled
again from its first token. The chunks chosen for a document are therefore reused while the
text above the cursor still holds the lines they were chosen under and the cursor has moved at
most REFRESH_LINES lines down from there (typing on, line after line), and while the repository's
other files stay as they were. They are retrieved again when the cursor moves up, jumps, goes
further down, or the repository changes under it. Retrieving at every new line would change
the context at about one line in four, each change a prefill of the whole prompt.
"""

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

from specdec.prompt.fim import settled_newline

CHARS_PER_TOKEN = 3.5  # code, with the default tokenizer: turns the token budget into characters
REFRESH_LINES = 12  # new lines above the cursor after which the context is chosen again
ANCHOR_CHARS = 400  # text before the line a context was chosen at, looked for in later prefixes
SEARCH_CHARS_PER_LINE = 200  # how far back the anchor is looked for, per line typed since


@dataclass(frozen=True)
class ContextSettings:
    """How much repository context a prompt gets, and how relevant it must be.

    tokens: of the prompt kept for retrieved chunks however long the file is (0: none retrieved);
    min_similarity: a similar window's token-set Jaccard with the cursor's neighbourhood below
    which it stays out (definitions of the names used near the cursor are always relevant);
    repository_format: the family's repository header (`<|repo_name|>` and the file's own
    `<|file_sep|>path` line) around the chunks, as the family was trained on it."""

    # A little, and only the closely similar: more, or looser, completed no better on flask and
    # starlette with a real 0.5B model, and cost its prefill on each document's first request
    # (bench/results/context_quality_*).
    tokens: int = 128
    min_similarity: float = 0.3
    repository_format: bool = True

    def __post_init__(self):
        if self.tokens < 0:
            raise ValueError("context tokens must be >= 0")
        if not 0 <= self.min_similarity <= 1:
            raise ValueError("context min_similarity must be in [0, 1]")


class ChosenContext(NamedTuple):
    """The chunks retrieved for a document, and what they were chosen under."""

    generation: int  # the repository's, outside the document, when they were chosen
    anchor: str  # the text just before the line they were chosen at (its last ANCHOR_CHARS)
    chunks: tuple

    def serves(self, above: str, generation: int) -> bool:
        """Whether these chunks serve a cursor below `above` (the text before its line): the same
        repository, the anchor still above the cursor, and at most REFRESH_LINES lines typed
        since. The anchor is the text just before the chosen line, so a client window that drops
        lines at its front (llama.vim's 256 lines) keeps it, and an edit above the cursor loses it."""
        if self.generation != generation:
            return False
        if not self.anchor:
            return not above
        reach = len(self.anchor) + SEARCH_CHARS_PER_LINE * REFRESH_LINES
        at = above.rfind(self.anchor, max(0, len(above) - reach))
        return at >= 0 and above.count("\n", at + len(self.anchor)) <= REFRESH_LINES


class StableContext:
    """document -> ChosenContext, an LRU of the latest documents."""

    def __init__(self, settings: ContextSettings | None = None, max_documents: int = 256):
        self.settings = settings or ContextSettings()
        self._chosen: OrderedDict = OrderedDict()  # document -> ChosenContext
        self.max_documents = max_documents
        self._lock = threading.Lock()

    def chunks(self, index, options) -> tuple[tuple, float]:
        """((filename, text) chunks, retrieval ms) for the request's cursor; ms is 0 when reused."""
        above = options.prefix[: settled_newline(options.prefix) + 1]  # Enter alone refreshes nothing
        path = index.relative(options.path) if options.path else None
        generation = index.retriever.generation(path)
        document = options.document if options.document is not None else path
        with self._lock:
            held = self._chosen.get(document)
            if held is not None and held.serves(above, generation):
                self._chosen.move_to_end(document)
                return held.chunks, 0.0
        started = time.perf_counter()
        found = index.retrieve(above, options.suffix, path=path, budget_chars=int(self.settings.tokens * CHARS_PER_TOKEN),
                               min_similarity=self.settings.min_similarity)
        chunks = tuple((c.path, c.text) for c in found)
        millis = (time.perf_counter() - started) * 1000
        with self._lock:
            self._chosen[document] = ChosenContext(generation, above[-ANCHOR_CHARS:], chunks)
            self._chosen.move_to_end(document)
            while len(self._chosen) > self.max_documents:
                self._chosen.popitem(last=False)
        return chunks, millis
