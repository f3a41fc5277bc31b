"""Fixtures of the engine's tests."""

import pytest

from specdec import Engine, load_model


@pytest.fixture(scope="module")
def engine(tiny_models):
    """The tiny models, always speculating with every node the sources offer."""
    return Engine(load_model(tiny_models[0]), load_model(tiny_models[1]), adaptive=False)
