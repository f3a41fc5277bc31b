"""No token is generated past the one that decides a completion's stop (the real default model,
when it is pulled: CI pulls it)."""

import dataclasses
import sysconfig
from pathlib import Path

from bench.waste import waste
from specdec_eval.points import sample_points
from tests.conftest import needs_pulled_default

pytestmark = needs_pulled_default
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def around_the_cursor(point, lines_before: int = 24, lines_after: int = 8):
    """The point with its file cut to whole lines near the cursor: the stop rules read only the
    cursor's line and the lines after it, and a short prompt keeps each prefill cheap."""
    prefix = "\n".join(point.prefix.split("\n")[-lines_before:])
    suffix = "\n".join(point.suffix.split("\n")[:lines_after])
    return dataclasses.replace(point, prefix=prefix, suffix=suffix)


def test_completions_stop_at_the_token_that_decides_them(pulled_engine):
    engine = pulled_engine
    files = ["textwrap.py", "shlex.py", "fractions.py", "bisect.py"]
    points = [around_the_cursor(point) for point in sample_points(STDLIB, 10, seed=3, files=files)]
    decided = 0
    for point in points:
        results = [engine.complete(point.prefix, point.suffix, strategy=strategy, mode=point.mode, max_tokens=32)
                   for strategy in ("ar", "hybrid")]
        assert results[0].tokens == results[1].tokens  # lossless
        for result in results:
            assert waste(engine, point.prefix, point.suffix, point.mode, result) == 0, (point, result.text)
        decided += results[0].stats.stop_reason != "limit"
    assert decided >= 5  # most stops are decided by the text, not the limit


def test_waste_counts_tokens_after_the_deciding_one(pulled_engine):
    engine = pulled_engine
    prefix = "def area(width, height):\n    return width * "
    result = engine.complete(prefix, "\n", mode="single", max_tokens=16, strategy="ar")
    assert result.stats.stop_reason == "newline" and waste(engine, prefix, "\n", "single", result) == 0
    longer = type(result)(result.text, result.tokens + engine.tokenizer.encode("x = 1\n").ids, result.stats)
    assert waste(engine, prefix, "\n", "single", longer) == len(engine.tokenizer.encode("x = 1\n").ids)
