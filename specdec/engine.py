"""Engine: the models, the prefix cache, the prompt cache and the scheduler behind one complete() call."""

import json
import logging
import threading
from pathlib import Path

import torch

from specdec.budget import VerifyCost
from specdec.drafting import AcceptanceStats
from specdec.fim import PromptBuilder
from specdec.generation import CompletionRequest, Generation, Result
from specdec.loader import load_model
from specdec.prompt_cache import PromptCache
from specdec.scheduler import Scheduler

log = logging.getLogger("specdec.engine")


def default_model_dir() -> Path:
    """The embedded default models: target/ and draft/, each a complete HF-layout directory."""
    return Path(__file__).resolve().parent / "default_models"


class Engine:
    def __init__(self, target, draft=None, index=None, *, max_tree_nodes: int = 64, draft_depth: int = 8,
                 adaptive: bool = True):
        """adaptive=False always speculates with every node the sources offer (up to the budget):
        for tests and measurements of speculation itself; True decides by measured speed."""
        if target.tokenizer is None:
            raise ValueError(f"{target.path}: the target model has no tokenizer.json")
        if draft is not None and draft.config.vocab_size != target.config.vocab_size:
            raise ValueError("draft and target vocabularies differ; the draft must share the target's tokenizer")
        self.target, self.draft, self.index = target, draft, index
        fim_mode = target.config.raw.get("fim_mode", "spm")
        self.prompts = PromptBuilder(target.tokenizer, fim_mode, min(1536, target.config.max_position_embeddings - 256))
        self.prompt_cache = PromptCache()
        self.acceptance = AcceptanceStats()
        self.max_tree_nodes, self.draft_depth = max_tree_nodes, draft_depth
        self.scheduler = Scheduler(self)
        self._verify_cost = None
        self._draft_min_prob = None
        self.lock = threading.Lock()
        # Milliseconds per generated token of speculative and of plain steps, per strategy (EMA):
        # speculation is used only where it is measured to be faster (it rarely is with a
        # draft the target disagrees with, or where verifying a tree wakes many more experts).
        self.step_speed = {}
        self._decisions = 0
        self.adaptive = adaptive

    EXPLORE_EVERY = 8  # one step in this many tries the slower kind, so the estimate stays current

    def should_speculate(self, strategy: str) -> bool:
        if not self.adaptive:
            return True
        speeds = self.step_speed.get(strategy, {})
        spec, plain = speeds.get("spec"), speeds.get("plain")
        if spec is None or plain is None:
            return spec is None
        self._decisions += 1
        faster = spec < plain
        return faster if self._decisions % self.EXPLORE_EVERY else not faster

    def record_step(self, strategy: str, speculative: bool, millis: float, tokens: int, rate: float = 0.1) -> None:
        if tokens <= 0:
            return
        speeds = self.step_speed.setdefault(strategy, {})
        kind = "spec" if speculative else "plain"
        value = millis / tokens
        speeds[kind] = value if kind not in speeds else speeds[kind] + rate * (value - speeds[kind])

    @classmethod
    def from_pretrained(cls, target=None, draft=None, index=None, **kwargs) -> "Engine":
        """None: the embedded defaults (target and draft) and no index; index: an Index or its directory."""
        defaults = default_model_dir()
        target_model = load_model(target or defaults / "target")
        draft_path = draft or (defaults / "draft" if target is None else None)
        draft_model = load_model(draft_path) if draft_path else None
        if index is not None and not hasattr(index, "propose"):
            from prefixcache import Index

            index = Index.load(index)
        return cls(target_model, draft_model, index, **kwargs)

    # hardware-sized budgets, measured once -------------------------------------------------

    @property
    def verify_cost(self) -> VerifyCost:
        if self._verify_cost is None:
            self._verify_cost = VerifyCost.measure(self.target)
            log.info("verify cost (ms) by tree size: %s",
                     json.dumps(dict(zip(self._verify_cost.sizes, [round(m, 2) for m in self._verify_cost.millis], strict=True))))
        return self._verify_cost

    @property
    def draft_min_prob(self) -> float:
        """Draft while a token's acceptance chance pays for its draft forward."""
        if self._draft_min_prob is None:
            ratio = 0.1
            if self.draft is not None:
                ratio = VerifyCost.measure(self.draft, repeats=3)(1) / self.verify_cost(1)
            self._draft_min_prob = min(0.5, max(0.05, ratio))
        return self._draft_min_prob

    # completing ---------------------------------------------------------------------------

    def generation(self, prefix: str, suffix: str = "", **options) -> Generation:
        return Generation(self, CompletionRequest(prefix, suffix, **options))

    def complete(self, prefix: str, suffix: str = "", *, max_tokens: int = 64, temperature: float = 0.0,
                 strategy: str = "hybrid", mode: str = "auto", path=None, extra=(), **options) -> Result:
        if path is not None and self.index is not None:
            path = self.index.relative(path)
        _ = self.verify_cost, self.draft_min_prob  # measured once, before any request is timed
        g = self.generation(prefix, suffix, max_tokens=max_tokens, temperature=temperature, strategy=strategy,
                            mode=mode, path=path, extra=tuple(extra), **options)
        if self.scheduler.thread is not None:
            self.scheduler.submit(g)
            g.finished.wait()
        else:
            with self.lock, torch.inference_mode():
                self.scheduler.run_until_done([g])
        if getattr(g, "error", None) is not None:
            raise g.error
        return g.result()
