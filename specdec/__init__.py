"""specdec: speculative decoding of code completions with an MoE target, a draft and a prefix cache.

What the server, the evaluation and users may rely on is exported here; see docs/architecture.md.
"""

from specdec.config import ConfigError, ModelConfig
from specdec.engine import Engine, EngineMetrics, default_model_dir, model_label
from specdec.generation import IllegalTransition, Result, State
from specdec.handle import CompletionHandle
from specdec.loader import CheckpointError, load_model
from specdec.model import Segment, Transformer
from specdec.options import (
    DEFAULT_STRATEGY,
    MODES,
    PLAIN,
    STRATEGIES,
    STRATEGY_TABLE,
    CompletionOptions,
    OptionsError,
    Strategy,
)
from specdec.scheduler import FinishedRecord, QueueFull
from specdec.stats import Stats
from specdec.textmetrics import edit_similarity, levenshtein

CompletionRequest = CompletionOptions  # the name before the options were one validated carrier

__all__ = ["load_model", "Engine", "EngineMetrics", "default_model_dir", "model_label", "ModelConfig", "Transformer", "Segment",
           "ConfigError", "CheckpointError", "CompletionOptions", "CompletionRequest", "OptionsError",
           "CompletionHandle", "Result", "Stats", "State", "IllegalTransition", "FinishedRecord", "STRATEGIES",
           "STRATEGY_TABLE", "Strategy", "PLAIN", "DEFAULT_STRATEGY",
           "MODES", "QueueFull", "edit_similarity", "levenshtein"]
