"""Fixtures of the engine's tests."""

import pytest
import torch

from specdec import Engine, load_model


@pytest.fixture(scope="module")
def engine(tiny_models):
    """The tiny models, always speculating with every node the sources offer."""
    return Engine(load_model(tiny_models[0]), load_model(tiny_models[1]), adaptive=False)


@pytest.fixture(scope="module")
def packed_target_and_head(tmp_path_factory):
    """A tiny Qwen2 GGUF (Q8_0, packed as it serves) and a random head of its shape, saved as published."""
    from gguf import GGMLQuantizationType

    from specdec.training.eagle3 import build_head, head_config, save_head
    from specdec_kernels import cpu_decode
    from tests.specdec.models.gguf_files import write_gguf
    from tests.specdec.models.test_gguf import tiny_transformers_model

    if cpu_decode.library() is None:
        pytest.skip("no C compiler for the native step")
    folder = tmp_path_factory.mktemp("packed_head")
    model = tiny_transformers_model("qwen2")
    model.save_pretrained(folder / "hf")
    file = write_gguf(folder / "qwen2.gguf", model, GGMLQuantizationType.Q8_0)
    floats = load_model(file)
    raw = head_config(floats.config)
    head = build_head(raw, floats, seed=3)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.requires_grad and "norm" not in name:
                p.mul_(10)  # weights large enough that drafts differ from token to token
    save_head(head, raw, folder / "head")
    return file, folder / "head"
