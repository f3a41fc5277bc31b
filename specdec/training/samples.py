"""Training sequences: plain text, FIM in PSM and SPM order, some with repository context first.

Formats (the same that specdec.fim assembles at completion time):
  context  <|file_sep|>{path}\n{text}            repeated per context file, before the file
  plain    <|file_sep|>{path}\n{window}<|endoftext|>
  PSM      <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>{middle}<|endoftext|>
  SPM      <|fim_prefix|><|fim_suffix|>{suffix}<|fim_middle|>{prefix}{middle}<|endoftext|>
In SPM the prefix runs straight into the middle, so they are tokenized as one text: the model
learns natural tokens across the cursor, and typing only appends to the prompt (cache-friendly).
"""

import random

from specdec.training.tokenizer import EOT, FILE_SEP, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX

WINDOW_CHARS = 1600  # about 430 tokens at 3.7 characters per token
CONTEXT_CHARS = 500


class SampleMaker:
    def __init__(self, files, tokenizer, seed: int):
        self.files = files
        self.tokenizer = tokenizer
        self.rng = random.Random(seed)
        self.by_package = {}
        for f in files:
            self.by_package.setdefault(f.package, []).append(f)
        self.weights = [len(f.text) for f in files]
        self.special = {t: tokenizer.token_to_id(t) for t in (EOT, FILE_SEP, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX)}

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids if text else []

    def sample(self) -> list[int]:
        """One training sample as token ids, ending with <|endoftext|>."""
        file = self.rng.choices(self.files, weights=self.weights)[0]
        window = self._window(file.text, WINDOW_CHARS)
        ids = self._context(file) if self.rng.random() < 0.35 else []
        kind = self.rng.random()
        if kind < 0.3:
            ids += [self.special[FILE_SEP]] + self.encode(f"{file.path}\n{window}")
        else:
            prefix, middle, suffix = self._split(window)
            if kind < 0.6:
                ids += [self.special[FIM_PREFIX]] + self.encode(prefix) + [self.special[FIM_SUFFIX]]
                ids += self.encode(suffix) + [self.special[FIM_MIDDLE]] + self.encode(middle)
            else:
                ids += [self.special[FIM_PREFIX], self.special[FIM_SUFFIX]] + self.encode(suffix)
                ids += [self.special[FIM_MIDDLE]] + self.encode(prefix + middle)
        return ids + [self.special[EOT]]

    def _window(self, text: str, size: int) -> str:
        """A run of whole lines of about `size` characters."""
        if len(text) <= size:
            return text
        start = self.rng.randrange(0, len(text) - size)
        start = text.rfind("\n", 0, start) + 1
        end = text.find("\n", start + size)
        return text[start : len(text) if end < 0 else end + 1]

    def _split(self, window: str):
        """(prefix, middle, suffix): a cursor anywhere, the middle running to the end of 1-6 lines."""
        cursor = self.rng.randrange(0, max(1, len(window)))
        if self.rng.random() < 0.4:  # editors often trigger at the start of a line
            cursor = window.rfind("\n", 0, cursor) + 1
        end = cursor
        for _ in range(min(6, int(self.rng.expovariate(0.6)) + 1)):
            nl = window.find("\n", end)
            end = len(window) if nl < 0 else nl + 1
        return window[:cursor], window[cursor:end], window[end:]

    def _context(self, file) -> list[int]:
        """One or two chunks of other files from the same package, each after the file separator."""
        others = [f for f in self.by_package.get(file.package, []) if f.path != file.path]
        if not others:
            return []
        ids = []
        for other in self.rng.sample(others, min(len(others), self.rng.choice((1, 2)))):
            chunk = self._window(other.text, CONTEXT_CHARS)
            ids += [self.special[FILE_SEP]] + self.encode(f"{other.path}\n{chunk}")
        return ids

    def batches(self, batch_size: int, seq_len: int):
        """Endless [batch_size, seq_len + 1] lists of packed samples."""
        buffer = []
        while True:
            rows = []
            while len(rows) < batch_size:
                while len(buffer) < seq_len + 1:
                    buffer += self.sample()
                rows.append(buffer[: seq_len + 1])
                buffer = buffer[seq_len + 1 :]
            yield rows
