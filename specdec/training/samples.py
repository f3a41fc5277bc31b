"""Training sequences: plain text and FIM (PSM and SPM), many with repository context chosen by retrieval.

Formats (the same that specdec.prompt.fim assembles at completion time):
  context  <|file_sep|>{path}\n{text}            repeated per context chunk, before the file
  plain    <|file_sep|>{path}\n{window}<|endoftext|>
  PSM      <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>{middle}<|endoftext|>
  SPM      <|fim_prefix|><|fim_suffix|>{suffix}<|fim_middle|>{prefix}{middle}<|endoftext|>
In SPM the prefix runs straight into the middle, so they are tokenized as one text: the model
learns natural tokens across the cursor, and typing only appends to the prompt (cache-friendly).

Copying is what the product needs most: the trie and the retriever put the repository's own code
in front of the target, and the target must agree with it. So windows are long (their natural
repetition is kept), context chunks are the windows of sibling files most similar to the text
around the cursor (prefixcache.similar, the ranking the engine retrieves with), and some samples
carry, as one of their chunks, the lines that the middle comes from, as the retriever's "source
lines of the trie's top candidates" would.

Each batch is a pure function of (seed, step), so a resumed run continues exactly where it stopped.
"""

import random
from dataclasses import dataclass

from prefixcache.similar import most_similar, windows
from specdec.training.tokenizer import EOT, FILE_SEP, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX


@dataclass(frozen=True)
class Mix:
    """Fractions of the sample kinds; what is left after plain and psm is SPM."""

    plain: float = 0.3
    psm: float = 0.2
    context: float = 0.5  # samples with retrieved chunks of sibling files first
    answer_chunk: float = 0.15  # samples whose context holds the lines around the middle
    window_chars: int = 3200  # about 860 tokens at 3.7 characters per token
    context_chars: int = 1400  # retrieved chunks, all together
    siblings: int = 8  # files whose windows are ranked for retrieval
    revision: float = 0.0  # samples whose only context is an edited earlier revision of their window
    recall: float = 0.0  # samples of unrelated lines, then some of them again in another order
    synthetic: float = 0.0  # samples of a run of random tokens, repeated: induction and nothing else


# Induction (copy what the context already holds) is what the plain mix taught least; the copy mix
# shows a third of the samples an earlier revision of their own code first, as the engine's
# "recently edited" chunks and the prompt cache do, with edits so that blind copying is wrong.
# The recall mix teaches induction outright: lines drawn from unrelated files cannot be predicted
# from each other, so the only way to complete a line seen before is to find it and copy it. Fresh
# lines among the repeats keep the model from copying whenever a line merely starts alike.
MIXES = {"default": Mix(), "copy": Mix(context=0.4, answer_chunk=0.15, revision=0.35),
         "recall": Mix(recall=0.25), "induct": Mix(recall=0.2, synthetic=0.3),
         "settle": Mix(recall=0.25, synthetic=0.05),  # after induct: code again, the circuit kept in use
         "psm": Mix(psm=0.7)}  # a family trained on PSM alone (Qwen2.5-Coder): no SPM samples


class SampleMaker:
    def __init__(self, files, tokenizer, seed: int, mix: Mix = Mix()):
        self.files, self.tokenizer, self.seed, self.mix = files, tokenizer, seed, mix
        self.by_group = {}
        for f in files:
            self.by_group.setdefault(f.directory, []).append(f)
            self.by_group.setdefault(f.package, []).append(f)
        self.cumulative, total = [], 0
        for f in files:
            total += min(len(f.text), 4 * mix.window_chars)  # a huge file is not worth 50 small ones
            self.cumulative.append(total)
        self.special = {t: tokenizer.token_to_id(t) for t in (EOT, FILE_SEP, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX)}
        # A tokenizer of another family (no Qwen FIM tokens) gets plain rows, and its missing
        # separators are left out rather than written as ids it does not have.
        self.fim = all(self.special[t] is not None for t in (FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX))

    def mark(self, token: str) -> list[int]:
        """The special token's id as a one-id list, or [] when the tokenizer has no such token."""
        found = self.special[token]
        return [] if found is None else [found]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids if text else []

    def sample(self, rng: random.Random) -> list[int]:
        """One training sample as token ids, ending with <|endoftext|>."""
        m, sp = self.mix, self.special
        file = self.files[_bisect(self.cumulative, rng.random() * self.cumulative[-1])]
        draw = rng.random()
        if draw >= 1 - m.recall - m.synthetic:
            return self._recall(rng, file) if draw >= 1 - m.recall else self._random_repeat(rng)
        revised = draw < m.revision  # the revision and the window share the row: half as long each
        window = _window(rng, file.text, m.window_chars // (2 if revised else 1))
        kind = rng.random() if self.fim else 0.0
        prefix, middle, suffix = ("", window, "") if kind < m.plain else _split(rng, window)
        ids = []
        if revised:
            ids = self.mark(FILE_SEP) + self.encode(f"{file.path}\n{_revised(rng, file.text, window)}\n")
        elif draw < m.revision + m.context:
            ids = self._context(rng, file, window, prefix, middle, suffix)
        if kind < m.plain:
            return ids + self.mark(FILE_SEP) + self.encode(f"{file.path}\n{window}") + self.mark(EOT)
        if kind < m.plain + m.psm:
            ids += [sp[FIM_PREFIX]] + self.encode(prefix) + [sp[FIM_SUFFIX]]
            ids += self.encode(suffix) + [sp[FIM_MIDDLE]] + self.encode(middle)
        else:
            ids += [sp[FIM_PREFIX], sp[FIM_SUFFIX]] + self.encode(suffix)
            ids += [sp[FIM_MIDDLE]] + self.encode(prefix + middle)
        return ids + self.mark(EOT)

    def _context(self, rng, file, window: str, prefix: str, middle: str, suffix: str) -> list[int]:
        """Retrieved chunks of sibling files (and maybe the middle's own lines), best last."""
        m = self.mix
        group = self.by_group.get(file.directory, [])
        if len(group) < 3:
            group = self.by_group.get(file.package, [])
        others = [f for f in group if f.path != file.path]
        candidates = []
        for other in rng.sample(others, min(len(others), m.siblings)):
            candidates += windows(other.path, other.text)
        query = (prefix[-1500:] + suffix[:500]) if (prefix or suffix) else window[: len(window) // 2]
        chunks = [(w.path, w.text) for _, w in most_similar(query, candidates, k=3)]
        if middle and rng.random() < m.answer_chunk / max(m.context, 1e-9):
            # It ranks first (it is the code itself), so it goes nearest the file, whole.
            chunks.insert(0, (file.path, _around(rng, window, prefix, middle)))
        ids, budget = [], m.context_chars
        for rank, (path, text) in enumerate(chunks):  # the best chunk nearest the file, as the engine packs them
            text = text if rank == 0 else text[:budget]
            if len(text) < 80 and rank > 0:
                break
            budget -= len(text)
            ids = self.mark(FILE_SEP) + self.encode(f"{path}\n{text}\n") + ids
        return ids

    def _recall(self, rng, file) -> list[int]:
        """Lines of random files, then a shuffled sample of them mixed with fresh lines."""
        def line() -> str:
            for _ in range(20):
                other = self.files[rng.randrange(len(self.files))].text
                at = other.rfind("\n", 0, rng.randrange(len(other) + 1)) + 1
                end = other.find("\n", at)
                text = other[at : len(other) if end < 0 else end]
                if 12 <= len(text.strip()) <= 120:
                    return text
            return "pass"
        seen = [line() for _ in range(rng.randrange(8, 40))]
        again = rng.sample(seen, rng.randrange(1, len(seen) + 1))
        again += [line() for _ in range(rng.randrange(0, 1 + len(again) // 3))]
        rng.shuffle(again)
        text = "\n".join(seen) + "\n" + "\n".join(again) + "\n"
        return self.mark(FILE_SEP) + self.encode(f"{file.path}\n{text}") + self.mark(EOT)

    def _random_repeat(self, rng) -> list[int]:
        special = set(self.special.values())
        run = [t for t in (rng.randrange(self.tokenizer.get_vocab_size()) for _ in range(rng.randrange(8, 64)))
               if t not in special]
        return run * rng.randrange(2, 5) + self.mark(EOT)

    def batch(self, step: int, batch_size: int, seq_len: int) -> list[list[int]]:
        """[batch_size, seq_len + 1] rows of packed samples, the same for the same (seed, step)."""
        rng = random.Random(self.seed * 1_000_003 + step)
        rows, buffer = [], []
        while len(rows) < batch_size:
            while len(buffer) < seq_len + 1:
                buffer += self.sample(rng)
            rows.append(buffer[: seq_len + 1])
            buffer = buffer[seq_len + 1 :] if rng.random() < 0.5 else []  # the rest starts the next row or goes
        return rows


def _bisect(cumulative: list[int], value: float) -> int:
    lo, hi = 0, len(cumulative) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cumulative[mid] <= value:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _window(rng: random.Random, text: str, size: int) -> str:
    """A run of whole lines of about `size` characters."""
    if len(text) <= size:
        return text
    start = rng.randrange(0, len(text) - size)
    start = text.rfind("\n", 0, start) + 1
    end = text.find("\n", start + size)
    return text[start : len(text) if end < 0 else end + 1]


def _revised(rng: random.Random, text: str, window: str) -> str:
    """An earlier revision of `window`: the same lines, often shifted, with some removed,
    duplicated or replaced by other lines of the file."""
    if rng.random() < 0.5:  # overlapping, not identical: the copy starts or ends elsewhere
        at = text.find(window)
        if at >= 0:
            start = text.rfind("\n", 0, max(0, at + int(len(window) * rng.uniform(-0.5, 0.5)))) + 1
            window = text[start : start + len(window)]
    lines, others, out = window.split("\n"), text.split("\n"), []
    for line in lines:
        edit = rng.random()
        if edit < 0.06:
            continue
        if edit < 0.10:
            out.append(rng.choice(others))
        out.append(line)
    return "\n".join(out)


def _split(rng: random.Random, window: str):
    """(prefix, middle, suffix): a cursor anywhere, the middle running to the end of 1-6 lines."""
    cursor = rng.randrange(0, max(1, len(window)))
    if rng.random() < 0.4:  # editors often trigger at the start of a line
        cursor = window.rfind("\n", 0, cursor) + 1
    end = cursor
    for _ in range(min(6, int(rng.expovariate(0.6)) + 1)):
        nl = window.find("\n", end)
        end = len(window) if nl < 0 else nl + 1
    return window[:cursor], window[cursor:end], window[end:]


def _around(rng: random.Random, window: str, prefix: str, middle: str) -> str:
    """The lines holding the middle, with a few lines either side."""
    start = len(prefix)
    for _ in range(rng.randrange(0, 6)):
        start = window.rfind("\n", 0, max(0, start - 1)) + 1
    start = window.rfind("\n", 0, start) + 1
    end = start + len(window[start:len(prefix)]) + len(middle)
    for _ in range(rng.randrange(0, 6)):
        nl = window.find("\n", end + 1)
        end = len(window) if nl < 0 else nl
    return window[start:end]
