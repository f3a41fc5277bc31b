"""specdec: speculative decoding of code completions with an MoE target, a draft and a prefix cache.

What the server, the evaluation and users may rely on is exported here; see docs/architecture.md.
"""

from specdec.cli import add_expert_parallel_arguments, add_model_arguments
from specdec.decode.handle import CompletionHandle
from specdec.decode.scheduler import FinishedRecord, QueueFull
from specdec.decode.states import IllegalTransition, State
from specdec.decode.stats import Result, Stats
from specdec.engine import Engine, EngineMetrics, default_model_dir, model_label
from specdec.models.config import ConfigError, ModelConfig
from specdec.models.loader import CheckpointError, load_model
from specdec.models.model import Segment, Transformer
from specdec.models.quantize import QUANTIZATIONS
from specdec.options import (
    DEFAULT_STRATEGY,
    FIM_MODES,
    MODES,
    PLAIN,
    STRATEGIES,
    STRATEGY_TABLE,
    CompletionOptions,
    OptionsError,
    Strategy,
)
from specdec.parallel.expert_parallel import run as run_expert_parallel
from specdec.prompt.retrieval import ContextSettings
from specdec.textmetrics import edit_similarity, levenshtein

__all__ = ["load_model", "Engine", "EngineMetrics", "default_model_dir", "model_label", "ModelConfig", "Transformer", "Segment",
           "ConfigError", "CheckpointError", "CompletionOptions", "OptionsError",
           "CompletionHandle", "Result", "Stats", "State", "IllegalTransition", "FinishedRecord", "STRATEGIES",
           "STRATEGY_TABLE", "Strategy", "PLAIN", "DEFAULT_STRATEGY",
           "MODES", "FIM_MODES", "QueueFull", "edit_similarity", "levenshtein", "ContextSettings", "QUANTIZATIONS",
           "add_model_arguments", "add_expert_parallel_arguments", "run_expert_parallel"]
