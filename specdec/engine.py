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
    def __init__(self, target, draft=None, index=None, *, max_tree_nodes: int = 64, draft_depth: int = 8):
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
