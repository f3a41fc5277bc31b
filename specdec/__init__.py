"""specdec: speculative decoding of code completions with an MoE target, a draft and a prefix cache."""

from specdec.config import ConfigError, ModelConfig
from specdec.loader import CheckpointError, load_model
from specdec.model import Segment, Transformer

__all__ = ["load_model", "ModelConfig", "Transformer", "Segment", "ConfigError", "CheckpointError"]
