"""Where speculated tokens come from: the prefix cache, the draft model or EAGLE-3 head, and n-gram lookup.

Every source returns DraftPaths rooted after the last committed token.
"""

import statistics
import time
from typing import NamedTuple

import torch

from specdec.models.eagle import Eagle3Head
from specdec.models.kvcache import KVCache, under_inference_mode
from specdec.models.model import Segment


class DraftPath(NamedTuple):
    """Speculated tokens rooted after the last committed token, from one source."""

    source: str  # "trie", "draft", "ngram", "history", "suggestion": who proposed them (acceptance is learned per source)
    tokens: list  # token ids
    probs: list  # probs[i]: the estimated chance that the target accepts the path up to tokens[i]


def trie_paths(index, text_before_cursor: str, path, encode, healed: str, stats, k: int = 6,
               max_tokens: int = 24) -> list[DraftPath]:
    """Candidates of the prefix cache, tokenized to continue the committed tokens.

    While token healing is pending (nothing generated yet), the candidate is tokenized together
    with the healed text, so that its first token extends what was taken out of the prompt.
    """
    if index is None:
        return []
    try:
        candidates = index.propose(text_before_cursor, path=path, k=k)
    except ValueError:
        return []
    paths = []
    for rank, cand in enumerate(candidates):
        tokens = encode(healed + cand.text)[:max_tokens]
        if tokens:
            paths.append(DraftPath("trie", tokens, stats.chain_probs("trie", len(tokens), rank)))
    return paths


def history_paths(history, document, text_before_cursor: str, encode, healed: str, stats,
                  max_tokens: int = 64, lengths=None, after: str = "") -> list[DraftPath]:
    """Continuations of the document's recent completions (source "suggestion") and of the text
    itself, before and `after` the cursor ("history"), after the tail of the text before the
    cursor; tokenized with the healed text, as trie candidates are. Both count as history
    tokens; their acceptance is learned apart."""
    paths = []
    found = history.continuations(document, text_before_cursor, lengths=lengths, after=after)
    for rank, (continuation, from_suggestion) in enumerate(found):
        tokens = encode(healed + continuation)[:max_tokens]
        source = "suggestion" if from_suggestion else "history"
        if tokens:
            paths.append(DraftPath(source, tokens, stats.chain_probs(source, len(tokens), rank)))
    return paths


def ngram_paths(sequence: list[int], stats, max_ngram: int = 4, max_tokens: int = 12,
                matches: int = 3) -> list[DraftPath]:
    """Prompt lookup: continuations of the latest n-gram's earlier occurrences in the sequence."""
    paths, seen = [], set()
    for n in range(min(max_ngram, len(sequence) - 1), 0, -1):
        tail = sequence[-n:]
        for start in range(len(sequence) - n - 1, -1, -1):
            if sequence[start : start + n] == tail:
                follow = tuple(sequence[start + n : start + n + max_tokens])
                if follow and follow not in seen:
                    seen.add(follow)
                    paths.append(DraftPath("ngram", list(follow), stats.chain_probs("ngram", len(follow), len(paths))))
                    if len(paths) >= matches:
                        return paths
        if paths:
            return paths
    return paths


def head(path: DraftPath, n: int) -> DraftPath:
    """The path's first n tokens (the path itself when it has no more)."""
    return path if len(path.tokens) <= n else DraftPath(path.source, path.tokens[:n], path.probs[:n])


def cut_after(path: DraftPath, ending) -> DraftPath:
    """The path up to and including its first token in `ending` (tokens that end the completion:
    any node after one could never be used)."""
    for i, token in enumerate(path.tokens):
        if token in ending:
            return head(path, i + 1)
    return path


def runner_ups(prob, best: int, before: float, min_prob: float, stop_ids=(), k: int = 3, to_target=None):
    """[(token, cumulative prob)] of the next `k - 1` most likely tokens after `best` in `prob`,
    where `before` is the probability of the chain up to here; those below min_prob, and stop
    tokens, are left out. to_target maps a head's draft-vocabulary ids to the target's."""
    top = torch.topk(prob, min(k, prob.numel()))
    found = []
    for index, q in zip(top.indices.tolist(), top.values.tolist(), strict=True):
        token = index if to_target is None else int(to_target(torch.tensor(index)))
        if index != best and before * q >= min_prob and token not in stop_ids:
            found.append((token, before * q))
    return found


def branch_paths(tokens: list, probs: list, alternatives) -> list[tuple[list, list]]:
    """(tokens, probs) of one-token branches off a greedy chain: alternatives[d] are the runner-ups
    at depth d, so a branch is the chain's first d tokens and then the runner-up."""
    return [(tokens[:depth] + [token], probs[:depth] + [prob])
            for depth, found in enumerate(alternatives) if depth <= len(tokens) for token, prob in found]


def keep_floor(min_prob: float, keep_prob: float | None) -> float:
    """The chance down to which a chain keeps a token it has computed (see extends): keep_prob,
    never above min_prob; min_prob itself when none is given."""
    return min_prob if keep_prob is None else min(keep_prob, min_prob)


def extends(token: int, cumulative: float, min_prob: float, stop_ids) -> bool:
    """Whether a chain drafts past `token`. A token whose distribution is computed costs only its
    tree node, so a chain keeps it down to its node's price (keep_prob); another draft forward
    pays only while the chain's chance so far (a bound on the next token's) is above min_prob,
    which adds that forward's cost. A single floor for both threw away, at the first depth, the
    token of every chain whose first forward had already been paid. A stop token is worth
    proposing (the target may end there too) but not extending."""
    return cumulative >= min_prob and token not in stop_ids


class DraftRunner:
    """Keeps the draft model's KV cache in step with one sequence and drafts greedy chains."""

    def __init__(self, model, cache=None, tokens=()):
        """cache, tokens: a draft cache an earlier request kept, and the tokens it holds."""
        self.model = model
        self.cache = cache if cache is not None else model.new_cache()
        self.synced = list(tokens[: self.cache.length])  # tokens whose keys and values are in the cache
        self.alternatives = []  # alternatives[d]: runner-ups at depth d of the last chain (see branch_paths)

    def sync(self, committed: list[int]) -> None:
        """Prefill the draft's cache with all but the last committed token (as the target's)."""
        self._rewind(committed)
        feed = committed[len(self.synced) : -1]
        if feed:
            positions = torch.arange(len(self.synced), len(self.synced) + len(feed))
            self.model(torch.tensor(feed), positions, [Segment(self.cache, len(feed))], logits_rows=[])
            self.cache.keep_all()
            self.synced.extend(feed)

    def catch_up(self, prompt: list[int]) -> None:
        """Hold the prompt (all but its last token, as sync) before drafting; what the cache
        holds past a prompt it already covers (this request's earlier drafting) stays."""
        if common_prefix(self.synced, prompt) < len(prompt) - 1:
            self.sync(prompt)

    def _rewind(self, committed: list[int]) -> None:
        common = min(common_prefix(self.synced, committed), len(committed) - 1)
        self.cache.truncate(common)
        self.synced = self.synced[:common]

    def chain(self, committed: list[int], max_depth: int, min_prob: float, allowed_first=None, stop_ids=(),
              keep_prob: float | None = None):
        """Greedy draft tokens after `committed` with the cumulative probability of each, and in
        self.alternatives the runner-ups [(token, prob)] at each depth: one-token branches that
        cost no extra forward, since each depth's distribution is computed for the chain anyway.
        min_prob: the chance below which another draft forward does not pay; keep_prob (default
        min_prob): the lower one at which a token already computed still pays for its tree node
        (see extends)."""
        keep = keep_floor(min_prob, keep_prob)
        self._rewind(committed)  # the last committed token is fed below
        feed = committed[len(self.synced) :]
        tokens, probs, p = [], [], 1.0
        self.alternatives = []
        for depth in range(max_depth):
            positions = torch.arange(len(self.synced), len(self.synced) + len(feed))
            logits = self.model(torch.tensor(feed), positions, [Segment(self.cache, len(feed))], logits_rows=[len(feed) - 1])[0]
            self.cache.keep_all()
            self.synced.extend(feed)
            if depth == 0 and allowed_first is not None:
                masked = torch.full_like(logits, float("-inf"))
                masked[allowed_first] = logits[allowed_first]
                logits = masked
            prob = torch.softmax(logits, dim=-1)
            token = int(torch.argmax(prob))
            self.alternatives.append(runner_ups(prob, token, p, keep, stop_ids))
            p *= float(prob[token])
            if p < keep:
                break
            tokens.append(token)
            probs.append(p)
            if not extends(token, p, min_prob, stop_ids):
                break
            feed = [token]
        return tokens, probs


def common_prefix(a: list, b: list) -> int:
    """Length of the common prefix of two token lists. Slices are compared in C, the whole
    prefix first (usually it matches: the draft's cache holds the prompt and its first tokens),
    then by halves: a Python loop over a whole prompt at every step would cost more than the rest."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@under_inference_mode
def head_step_millis(head: Eagle3Head, context: int = 512, repeats: int = 9) -> float:
    """Milliseconds of one drafting step of an EAGLE-3 head (its own output fed back, its LM
    head included) over `context` cached rows, the median of `repeats`: what each token of a
    head's chain costs, as a target forward is what each plain token costs."""
    cache = head.new_cache(context + repeats + 1)
    features = torch.zeros(context, 3 * head.config.target_hidden_size, dtype=head.dtype)
    positions = torch.arange(1, context + 1)
    _, hidden = head(torch.zeros(context, dtype=torch.long), features, positions, cache)
    times = []
    for r in range(repeats):
        started = time.perf_counter()
        head(torch.zeros(1, dtype=torch.long), hidden[-1:], torch.tensor([context + 1 + r]), cache, fused=True)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


class EagleRunner:
    """An EAGLE-3 head's cache and the target's features, in step with one sequence.

    features[p] are the captured hidden states at position p, one row per token the target has
    processed (its KV cache length). The head's cache holds the pairs (features[p], token p + 1)
    for p < synced; drafting feeds the pairs it lacks, then its own outputs, and forgets the
    speculated rows afterwards.
    """

    def __init__(self, head: Eagle3Head, features: torch.Tensor | None = None, cache: KVCache | None = None,
                 synced: int = 0):
        """features, cache, synced: what a prompt-cache entry kept of an earlier request."""
        self.head = head
        self.cache = cache if cache is not None else head.new_cache()
        width = 3 * head.config.target_hidden_size
        # Rows live in a buffer grown by doubling: appending a step's rows copies only them.
        self._rows = features if features is not None else torch.zeros(0, width, dtype=head.dtype)
        self._length = len(self._rows)
        self.synced = synced if cache is not None else 0
        self.cache.truncate(self.synced)
        self.alternatives = []

    @property
    def features(self) -> torch.Tensor:
        """[tokens the target processed, k*H] (a view of the buffer)."""
        return self._rows[: self._length]

    def extend(self, rows: torch.Tensor) -> None:
        need = self._length + len(rows)
        if need > len(self._rows):
            grown = self._rows.new_zeros((max(need, 2 * len(self._rows)), self._rows.shape[1]))
            grown[: self._length] = self._rows[: self._length]
            self._rows = grown
        self._rows[self._length : need] = rows
        self._length = need

    def truncate(self, length: int) -> None:
        """Keep the features of the first `length` tokens (a prompt-cache prefix reused)."""
        self._length = min(self._length, length)
        self.synced = min(self.synced, max(0, length - 1))
        self.cache.truncate(self.synced)

    def _usable(self, committed: list[int]) -> int:
        """How many pairs (features[p], committed[p + 1]) there are."""
        return min(len(self.features), len(committed) - 1)

    @under_inference_mode
    def sync(self, committed: list[int]) -> None:
        """Feed the head the pairs it lacks, all but the last, without its LM head: chain() feeds
        the last one for its logits. A prefill calls it chunk by chunk, so that the first step
        that drafts after a long prompt pays for a few rows, not for the whole prompt."""
        end = self._usable(committed) - 1
        if end <= self.synced:
            return
        self.cache.truncate(self.synced)
        p = torch.arange(self.synced, end)
        self.head.advance(torch.tensor(committed[self.synced + 1 : end + 1]), self.features[p], p + 1, self.cache)
        self.synced = end

    @under_inference_mode
    def chain(self, committed: list[int], max_depth: int, min_prob: float, allowed_first=None, stop_ids=(),
              keep_prob: float | None = None):
        """Greedy target-vocabulary tokens after `committed` with their cumulative probabilities,
        and the runner-ups at each depth in self.alternatives, as DraftRunner.chain gives them."""
        self.alternatives = []
        keep = keep_floor(min_prob, keep_prob)
        usable = self._usable(committed)
        if usable <= 0:
            return [], []
        self.synced = min(self.synced, usable - 1)  # the last pair is fed here, for its logits
        self.cache.truncate(self.synced)
        p = torch.arange(self.synced, usable)
        # Every pair not fed yet in one forward, the LM head on the last row alone: after a
        # verify pass a row or two wait, and feeding them apart (sync, then the last pair for its
        # logits) paid the head's fixed cost per forward twice.
        hidden = self.head.advance(torch.tensor(committed[self.synced + 1 : usable + 1]), self.features[p], p + 1,
                                   self.cache)
        logits = self.head.logits(hidden[-1:])
        self.synced = usable
        tokens, probs, cumulative = [], [], 1.0
        for depth in range(max_depth):
            prob = torch.softmax(self._restricted(logits[-1], allowed_first if depth == 0 else None), dim=-1)
            best = int(prob.argmax())
            token = int(self.head.to_target(torch.tensor(best)))
            self.alternatives.append(runner_ups(prob, best, cumulative, keep, stop_ids, to_target=self.head.to_target))
            cumulative *= float(prob[best])
            if cumulative < keep:
                break
            tokens.append(token)
            probs.append(cumulative)
            if not extends(token, cumulative, min_prob, stop_ids) or depth + 1 == max_depth:
                break
            position = torch.tensor([usable + 1 + depth])
            logits, hidden = self.head(torch.tensor([token]), hidden[-1:], position, self.cache, fused=True)
        self.cache.truncate(self.synced)  # the speculated rows go; the real pairs stay
        return tokens, probs

    def _restricted(self, logits, allowed_first):
        if allowed_first is None:
            return logits
        targets = self.head.to_target(torch.arange(logits.numel()))
        keep = torch.isin(targets, torch.as_tensor(allowed_first))
        return logits.masked_fill(~keep, float("-inf")) if bool(keep.any()) else logits
