"""The Spark tests' one SparkSession (`local[2]`): starting one takes seconds, so the pipeline
tests share it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from pipeline.spark import session

    s = session("local[2]", app="pinmq-tests")
    yield s
    s.stop()
