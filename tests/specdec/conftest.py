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


@pytest.fixture
def pulled_tiny(packed_target_and_head, tmp_path, monkeypatch):
    """The tiny GGUF pulled into a models cache as the registry's default model "tiny":
    (the cache directory, the pulled file, its SHA-256)."""
    import hashlib
    import json
    import shutil

    home = tmp_path / "cache"
    home.mkdir()
    pulled = shutil.copy(packed_target_and_head[0], home / "tiny.gguf")
    digest = hashlib.sha256(pulled.read_bytes()).hexdigest()
    registry = {"default": "tiny", "models": {"tiny": {"file": "tiny.gguf", "description": "a tiny qwen2",
                                                       "license": "MIT", "size": pulled.stat().st_size,
                                                       "sha256": digest, "chunks": []}}}
    (tmp_path / "models.json").write_text(json.dumps(registry))
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    monkeypatch.setenv("SPECDEC_MODELS_REGISTRY", str(tmp_path / "models.json"))
    return home, pulled, digest
