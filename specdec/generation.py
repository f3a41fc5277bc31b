"""Generation: the state of one completion request as the scheduler steps it.

Flow of one request: CompletionRequest (what was asked) -> Generation.prepare (prompt, prompt-cache
reuse, prefill) -> per step: Generation.propose (a TokenTree) -> the scheduler's batched target
forward -> Generation.commit (acceptance, caches, stop rules) -> Result.
"""

import threading
import time
from dataclasses import dataclass, field

import torch

from specdec.accept import Sampling, Uniforms, accept
from specdec.budget import grow_tree, min_useful_prob
from specdec.drafting import DraftRunner, ngram_paths, trie_paths
from specdec.model import Segment
from specdec.stops import rules_for
from specdec.tree import TokenTree

STRATEGIES = ("ar", "draft", "ngram", "trie", "hybrid")
MODES = ("auto", "single", "multi")


@dataclass
class CompletionRequest:
    prefix: str
    suffix: str = ""
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    strategy: str = "hybrid"
    mode: str = "auto"
    path: str | None = None
    extra: tuple = ()
    seed: int = 0
    n_indent: int | None = None
    stop: tuple = ()
    time_budget_ms: float | None = None
    time_budget_after_newline: bool = False  # llama.cpp: t_max_predict_ms only ends a completion after a newline
    use_prompt_cache: bool = True
    document: str | None = None  # requests for the same document supersede each other

    def validate(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy {self.strategy!r}: expected one of {', '.join(STRATEGIES)}")
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: expected one of {', '.join(MODES)}")
        if self.max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")


@dataclass
class Result:
    text: str
    tokens: list
    stats: dict = field(default_factory=dict)
    truncated: bool = False


class Generation:
    def __init__(self, engine, request: CompletionRequest):
        request.validate()
        self.engine, self.request = engine, request
        # The prompt is built when the request begins, on the scheduler thread: a request
        # superseded while it waits (most keystrokes, when typing fast) is never tokenized.
        self.prompt, self.allowed_first, self.allowed_set = None, None, None
        self.committed = []
        self.sampling = Sampling(request.temperature, request.top_p, request.top_k)
        self.rules = rules_for(request.prefix, request.suffix, request.mode, request.n_indent, request.stop)
        self.uniforms = Uniforms(request.seed)
        self.generated, self.text, self.final_text = [], "", None
        self.cancelled = threading.Event()
        self.finished = threading.Event()
        self.stop_reason = None
        self.cache = self.draft = None
        self.speculating = False
        self.on_tokens = None  # optional callback(text_so_far) for streaming, called on the scheduler thread
        self.on_finish = None  # optional callback() once finished, called on the thread that finishes it
        self.error = None
        self.stats = {"target_passes": 0, "accepted_by_source": {"trie": 0, "draft": 0, "ngram": 0, "bonus": 0},
                      "prefill_tokens": 0, "cached_tokens": 0, "tree_nodes": 0}
        self.started = time.perf_counter()
        self.decode_started = None

    # prefill ------------------------------------------------------------------------------

    def begin(self) -> None:
        """Build the prompt and take its longest cached prefix; the rest is fed by prefill_segment()."""
        engine, request = self.engine, self.request
        self.prompt = engine.prompts.build(request.prefix, request.suffix, request.extra, request.path)
        self.allowed_first = self.prompt.allowed_first
        self.allowed_set = set(self.allowed_first) if self.allowed_first is not None else None
        self.committed = ids = list(self.prompt.ids)
        entry, common = engine.prompt_cache.take(ids) if self.request.use_prompt_cache else (None, 0)
        if entry is not None:
            self.cache = entry.target
            reuse = min(common, self.cache.length, len(ids) - 1)
            self.cache.truncate(reuse)
        else:
            self.cache, reuse = engine.target.new_cache(len(ids) + self.request.max_tokens + 80), 0
        if self.request.strategy in ("draft", "hybrid") and engine.draft is not None:
            self.draft = DraftRunner(engine.draft)
            if entry is not None and entry.draft is not None:
                self.draft.adopt(entry.draft, entry.draft_tokens)
        self.stats["prefill_tokens"], self.stats["cached_tokens"] = len(ids) - reuse, reuse
        if self.prefill_remaining() == 0:
            self._prefilled()

    def prefill_remaining(self) -> int:
        """Prompt tokens not yet in the cache (all but the last one, which the first step feeds)."""
        return len(self.committed) - 1 - self.cache.length

    def prefill_segment(self, count: int):
        """(tokens, positions, Segment) of the next `count` prompt tokens, for a batched forward."""
        start = self.cache.length
        feed = self.committed[start : start + count]
        return torch.tensor(feed), torch.arange(start, start + len(feed)), Segment(self.cache, len(feed))

    def prefill_fed(self) -> None:
        """After the forward over prefill_segment()'s tokens: keep them; finish the prefill if done."""
        self.cache.keep_all()
        if self.prefill_remaining() == 0:
            self._prefilled()

    @property
    def prefilling(self) -> bool:
        return self.decode_started is None

    def _prefilled(self) -> None:
        if self.draft is not None:
            self.draft.sync(self.committed)
        self.stats["prefill_ms"] = (time.perf_counter() - self.started) * 1000
        self.decode_started = time.perf_counter()
        if self.request.max_tokens == 0:
            self._finish("limit")

    # one step -----------------------------------------------------------------------------

    @property
    def healing_pending(self) -> bool:
        return not self.generated and self.allowed_first is not None

    def propose(self) -> TokenTree:
        engine, strategy = self.engine, self.request.strategy
        tree = TokenTree(self.committed[-1])
        self.speculating = strategy != "ar" and engine.should_speculate(strategy)
        if not self.speculating:
            return tree
        paths = []
        healed = self.prompt.healed_text if self.healing_pending else ""
        if strategy in ("trie", "hybrid"):
            paths += trie_paths(engine.index, self.request.prefix + self.text, self.request.path,
                                engine.prompts.encode, healed, engine.acceptance)
        if strategy == "ngram":
            paths += ngram_paths(self.committed, engine.acceptance)
        if self.draft is not None:
            # A draft token must pay for its draft forward and for its place in the tree.
            floor = engine.draft_min_prob
            if engine.adaptive:
                floor = max(floor, min_useful_prob(engine.verify_cost)) / engine.acceptance.draft_scale
            tokens, probs = self.draft.chain(self.committed, engine.draft_depth, min(0.95, floor),
                                             self.allowed_first if self.healing_pending else None, engine.prompts.stop_ids)
            scale = engine.acceptance.draft_scale
            paths.append(("draft", tokens, [p * scale for p in probs]))
            paths += [("draft", [token], [prob * scale]) for token, prob in self.draft.alternatives]
        if self.allowed_set is not None and self.healing_pending:
            paths = [p for p in paths if p[1] and p[1][0] in self.allowed_set]
        grow_tree(tree, paths, engine.verify_cost, engine.max_tree_nodes, force=not engine.adaptive)
        self.stats["tree_nodes"] += len(tree)
        return tree

    def segment(self, tree: TokenTree):
        base = len(self.committed) - 1
        positions = torch.tensor([base + d for d in tree.depths])
        mask = None if tree.is_chain() else tree.ancestor_mask()
        return torch.tensor(tree.tokens), positions, Segment(self.cache, len(tree), mask)

    def commit(self, tree: TokenTree, logits) -> None:
        """Accept against the target's logits [len(tree), vocab]; update caches, text and stops."""
        first = self.allowed_first if self.healing_pending else None
        result = accept(tree, logits, self.sampling, self.uniforms, first, position=len(self.committed))
        self.cache.keep([0] + result.nodes)
        self.stats["target_passes"] += 1
        by_source = self.stats["accepted_by_source"]
        for node in result.nodes:
            by_source[tree.sources[node]] = by_source.get(tree.sources[node], 0) + 1
        by_source["bonus"] += 1
        self._learn(tree, result.nodes)
        new_tokens = [tree.tokens[n] for n in result.nodes] + [result.bonus]
        self.last_step_tokens = len(new_tokens)
        self.committed.extend(new_tokens)
        for token in new_tokens:
            if self._append(token):
                break
        if not self.finished.is_set() and self._over_time():
            self._finish("time")
        if self.on_tokens is not None:
            self.on_tokens(self.current_text())

    def _append(self, token: int) -> bool:
        """Add one generated token; True when a stop rule ends the completion."""
        if token in self.engine.prompts.stop_ids:
            self._finish("eos")
            return True
        self.generated.append(token)
        decoded = self.engine.prompts.tokenizer.decode(self.generated, skip_special_tokens=False)
        self.text = decoded[len(self.prompt.healed_text) :]
        cut, reason = self.rules.cut(self.text)
        if cut is not None:
            self.final_text = self.text[:cut]
            self._finish(reason)
            return True
        if len(self.generated) >= self.request.max_tokens:
            self._finish("limit")
            return True
        return False

    def _over_time(self) -> bool:
        budget = self.request.time_budget_ms
        if budget is None or self.decode_started is None:
            return False
        if self.request.time_budget_after_newline and "\n" not in self.text:
            return False
        return (time.perf_counter() - self.decode_started) * 1000 > budget

    def _learn(self, tree: TokenTree, accepted_nodes) -> None:
        depth_by_source = {}
        for node in range(1, len(tree)):
            s = tree.sources[node]
            depth_by_source[s] = max(depth_by_source.get(s, 0), tree.depths[node])
        accepted = {}
        for node in accepted_nodes:
            accepted[tree.sources[node]] = accepted.get(tree.sources[node], 0) + 1
        for source, depth in depth_by_source.items():
            self.engine.acceptance.update(source, depth, accepted.get(source, 0))
        predicted = sum(tree.probs[n] for n in range(1, len(tree)) if tree.sources[n] == "draft")
        self.engine.acceptance.update_draft(predicted, accepted.get("draft", 0))

    def _finish(self, reason: str) -> None:
        if self.finished.is_set():
            return
        if self.stop_reason is None:
            self.stop_reason = reason
        self.finished.set()
        if self.on_finish is not None:
            self.on_finish()

    def cancel(self) -> None:
        self.cancelled.set()

    # result -------------------------------------------------------------------------------

    def current_text(self) -> str:
        return self.final_text if self.final_text is not None else self.text

    def result(self) -> Result:
        now = time.perf_counter()
        stats = dict(self.stats)
        passes = stats["target_passes"]
        stats["generated_tokens"] = len(self.generated)
        stats["tau"] = len(self.generated) / passes if passes else 0.0
        stats["decode_ms"] = (now - self.decode_started) * 1000 if self.decode_started else 0.0
        stats["total_ms"] = (now - self.started) * 1000
        stats["stop_reason"] = self.stop_reason or ("cancelled" if self.cancelled.is_set() else "none")
        stats.setdefault("prefill_ms", 0.0)
        return Result(self.current_text(), list(self.generated), stats, self.prompt is not None and self.prompt.truncated)

    def release(self) -> None:
        """Give the caches back to the prompt cache for the next request."""
        worth_keeping = self.cache is not None and self.cache.length >= self.engine.prompt_cache.min_reuse
        if worth_keeping and self.request.use_prompt_cache:
            draft_cache = self.draft.cache if self.draft is not None else None
            draft_tokens = self.draft.synced if self.draft is not None else ()
            self.engine.prompt_cache.put(self.committed, self.cache, draft_cache, draft_tokens)
        self.cache = None
