"""A tiny real Qwen2 as a GGUF file, and token rows for it: the target of the feature-store and
dense-draft tests (plain functions, so that each test module keeps its own fixtures)."""

import random
from pathlib import Path

from gguf import GGMLQuantizationType

from tests.specdec.models.gguf_files import write_gguf
from tests.specdec.models.test_gguf import tiny_transformers_model


def tiny_qwen2_gguf(folder: Path) -> Path:
    """A tiny Qwen2 in Q8_0, with its Hugging Face folder beside it (which names its architecture)."""
    model = tiny_transformers_model("qwen2")
    model.save_pretrained(folder / "hf")
    return write_gguf(folder / "qwen2.gguf", model, GGMLQuantizationType.Q8_0)


def random_rows(count: int, length: int, seed: int = 0) -> list[list[int]]:
    """`count` rows of `length` + 1 token ids under 300 (the row's last token is its last target)."""
    rng = random.Random(seed)
    return [[rng.randrange(300) for _ in range(length + 1)] for _ in range(count)]
