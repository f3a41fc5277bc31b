"""Every kernel test starts and ends with the default dispatch choice."""

import pytest

from specdec_kernels.dispatch import set_backend


@pytest.fixture(autouse=True)
def default_backend():
    set_backend("auto")
    yield
    set_backend("auto")
