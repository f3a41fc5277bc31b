"""Repository context for a prompt: the index's retrieved chunks, kept stable while the cursor
stays on one line.

A prompt whose context changed at every keystroke would be prefilled again from its first token;
so the chunks chosen for a document are reused while the text before the cursor's line, the text
after the cursor and the other files of the repository stay as they were, and retrieved again when
the cursor moves to another line or the repository changes under it.
"""

import threading
import time
import zlib
from collections import OrderedDict

CONTEXT_RESERVE_TOKENS = 512  # of the prompt kept for retrieved chunks however long the file is
CHARS_PER_TOKEN = 3.5  # code, with the default tokenizer: turns the token budget into characters


class StableContext:
    """(document, line key) -> retrieved chunks, an LRU of the latest documents."""

    def __init__(self, max_documents: int = 256):
        self._chosen: OrderedDict = OrderedDict()  # document -> (key, chunks)
        self.max_documents = max_documents
        self._lock = threading.Lock()

    def chunks(self, index, options) -> tuple[tuple, float]:
        """((filename, text) chunks, retrieval ms) for the request's cursor; ms is 0 when reused."""
        line_start = options.prefix.rfind("\n") + 1
        path = index.relative(options.path) if options.path else None
        key = (zlib.crc32(options.prefix[:line_start].encode("utf-8", "surrogatepass")),
               zlib.crc32(options.suffix.encode("utf-8", "surrogatepass")), index.retriever.generation(path))
        document = options.document if options.document is not None else path
        with self._lock:
            held = self._chosen.get(document)
            if held is not None and held[0] == key:
                self._chosen.move_to_end(document)
                return held[1], 0.0
        started = time.perf_counter()
        found = index.retrieve(options.prefix[:line_start], options.suffix, path=path,
                               budget_chars=int(CONTEXT_RESERVE_TOKENS * CHARS_PER_TOKEN))
        chunks = tuple((c.path, c.text) for c in found)
        millis = (time.perf_counter() - started) * 1000
        with self._lock:
            self._chosen[document] = (key, chunks)
            self._chosen.move_to_end(document)
            while len(self._chosen) > self.max_documents:
                self._chosen.popitem(last=False)
        return chunks, millis
