"""The real default model (Qwen2.5-Coder-0.5B-Instruct, GGUF), when it is pulled: `scripts/setup.sh`
pulls it, so CI runs these; elsewhere they skip and say how to pull it. Completions come from the
packed model, as `specdec serve` runs it (the session's `pulled_engine`); the comparison with
transformers loads the float weights."""

import sysconfig
from pathlib import Path

import pytest
import torch

from specdec import load_model
from tests.conftest import PULLED_DEFAULT, needs_pulled_default

PATH = PULLED_DEFAULT
pytestmark = needs_pulled_default
STDLIB = Path(sysconfig.get_paths()["stdlib"])
POINT = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self."


@pytest.fixture
def engine(pulled_engine):
    return pulled_engine


@pytest.fixture(scope="module")
def transformers_parses_the_file_once():
    """transformers parses the GGUF file for the config, again for the weights and again for the
    tokenizer, half a minute each (its tokenizer's arrays, item by item): one parse serves all
    three, as the reader is only read."""
    import gguf

    original, readers = gguf.GGUFReader, {}

    def shared_reader(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = original(path, *args, **kwargs)
        return readers[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", shared_reader)
        yield


def test_the_default_completes_the_point_class(engine):
    result = engine.complete(POINT, "", max_tokens=24, strategy="ar")
    assert result.text.rstrip("\n") == "y = y"
    assert engine.complete(POINT, "", max_tokens=24, strategy="hybrid").tokens == result.tokens  # lossless


@pytest.mark.parametrize(("prefix", "suffix", "completion"), [
    ("import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument(\n    '--verbose',\n"
     "    action='store_true',\n    help='print more',\n)\nparser.add_argument(\n    '--descri", "\n)\n", "ption',"),
    ("def compute_total(items):\n    total = 0\n    for item in items:\n        total += item.pri",
     "\n    return total\n", "ce"),
])
def test_a_cursor_inside_a_word_completes_the_word(engine, prefix, suffix, completion):
    """Once empty: the engine returned '' where the plain FIM prompt writes the rest of the word."""
    text = engine.complete(prefix, suffix, max_tokens=16, strategy="ar", mode="single").text
    assert text.startswith(completion), text


@pytest.mark.parametrize(("prefix", "completion"), [
    ("def total(items):\n    result = 0\n    for item in items:\n        result += item\n    ", "return result"),
    ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        ", "self.y = y"),
    ("for i in range(10):\n\tif i % 2:\n\t\t", "print(i"),
])
def test_a_cursor_after_indentation_completes_the_line(engine, prefix, completion):
    """Qwen's tokenizer joins an indentation's last space to the next word; healing the whole
    indentation as one token once made the completion indent again or come back empty."""
    result = engine.complete(prefix, "", max_tokens=8, strategy="ar", mode="single")
    assert result.text.startswith(completion), result.text
    assert engine.complete(prefix, "", max_tokens=8, strategy="hybrid", mode="single").tokens == result.tokens


def test_the_tokenizer_gives_transformers_ids_for_the_same_file(engine, transformers_parses_the_file_once):
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(str(PATH.parent), gguf_file=PATH.name)
    files = sorted(STDLIB.glob("*.py"))[:40]
    assert len(files) == 40
    for file in files:
        text = file.read_text(encoding="utf-8", errors="replace")
        assert engine.tokenizer.encode(text).ids == theirs.encode(text, add_special_tokens=False), file.name


def test_the_logits_match_transformers_own_gguf_load(transformers_parses_the_file_once):
    pytest.importorskip("accelerate")  # transformers needs it to read GGUF files
    from transformers import AutoModelForCausalLM

    model = load_model(PATH)  # the float weights: transformers dequantizes them the same way
    theirs = AutoModelForCausalLM.from_pretrained(str(PATH.parent), gguf_file=PATH.name, dtype=torch.float32).eval()
    ids = torch.tensor([model.tokenizer.encode((STDLIB / "textwrap.py").read_text()).ids[:96]])
    with torch.no_grad():
        ours, reference = model.logits(ids), theirs(ids).logits
    assert (ours - reference).abs().max() / reference.abs().max() < 1e-3
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))
