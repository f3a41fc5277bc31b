"""specdec: speculative decoding of code completions with an MoE target, a draft and a prefix cache."""

from specdec.config import ConfigError, ModelConfig
from specdec.engine import Engine, default_model_dir
from specdec.generation import STRATEGIES, CompletionRequest, Result
from specdec.loader import CheckpointError, load_model
from specdec.model import Segment, Transformer
from specdec.scheduler import QueueFull

__all__ = ["load_model", "Engine", "default_model_dir", "ModelConfig", "Transformer", "Segment", "ConfigError",
           "CheckpointError", "CompletionRequest", "Result", "STRATEGIES", "QueueFull"]
