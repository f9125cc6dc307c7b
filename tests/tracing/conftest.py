"""The OTLP receiver the tracing tests' servers export to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.tracing.receiver import Receiver


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    """A real OTLP/HTTP receiver on a free loopback port, for the servers of one test module."""
    receiver = Receiver()
    yield receiver
    receiver.close()
