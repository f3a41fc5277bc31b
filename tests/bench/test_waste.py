"""No token is generated past the one that decides a completion's stop (the real default model,
when it is pulled: CI pulls it)."""

import sysconfig
from pathlib import Path

import pytest

from bench.waste import waste
from specdec import Engine, load_model
from specdec.models.model_cache import installed_path
from specdec_eval.points import sample_points
from tests.conftest import PULLED_MODELS

NAME = "qwen2.5-coder-0.5b"
PATH = installed_path(NAME, PULLED_MODELS)
pytestmark = pytest.mark.skipif(PATH is None, reason=f"{NAME} is not pulled (specdec models pull {NAME})")
STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def engine():
    engine = Engine(load_model(PATH, packed=True), None, None, warm_up=False)
    yield engine
    engine.stop()


def test_completions_stop_at_the_token_that_decides_them(engine):
    points = sample_points(STDLIB, 16, seed=3, files=["textwrap.py", "shlex.py", "fractions.py", "bisect.py"])
    decided = 0
    for point in points:
        results = [engine.complete(point.prefix, point.suffix, strategy=strategy, mode=point.mode, max_tokens=32)
                   for strategy in ("ar", "hybrid")]
        assert results[0].tokens == results[1].tokens  # lossless
        for result in results:
            assert waste(engine, point.prefix, point.suffix, point.mode, result) == 0, (point, result.text)
        decided += results[0].stats.stop_reason != "limit"
    assert decided >= 8  # most stops are decided by the text, not the limit


def test_waste_counts_tokens_after_the_deciding_one(engine):
    prefix = "def area(width, height):\n    return width * "
    result = engine.complete(prefix, "\n", mode="single", max_tokens=16, strategy="ar")
    assert result.stats.stop_reason == "newline" and waste(engine, prefix, "\n", "single", result) == 0
    longer = type(result)(result.text, result.tokens + engine.tokenizer.encode("x = 1\n").ids, result.stats)
    assert waste(engine, prefix, "\n", "single", longer) == len(engine.tokenizer.encode("x = 1\n").ids)
