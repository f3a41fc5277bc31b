"""The default model's greedy output is the same through the Triton kernels (interpreter) as through PyTorch."""

import os

import pytest

import specdec_kernels as kernels
from specdec import Engine

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


def test_default_model_greedy_same_with_triton_kernels(monkeypatch):
    engine = Engine.from_pretrained()
    prompts = [("def add(a, b):\n    return ", "\n"), ("import os\n\npath = os.path.", "\n")]
    outputs = {}
    for backend in ("torch", "triton"):
        kernels.set_backend(backend)
        engine.prompt_cache.clear()
        outputs[backend] = [engine.complete(p, s, strategy="ar", max_tokens=3, use_prompt_cache=False).tokens
                            for p, s in prompts]
    assert outputs["triton"] == outputs["torch"]
    assert all(outputs["torch"])
