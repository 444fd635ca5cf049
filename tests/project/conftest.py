"""The served gateway the project's tests share, one per test module."""

import pytest
from console import Served


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    gw = Served(str(tmp_path_factory.mktemp("var")))
    yield gw
    if gw.proc.poll() is None:
        gw.stop()
