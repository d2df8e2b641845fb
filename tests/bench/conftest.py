"""Each bench test starts with no fake local topology left over from another."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .fakeserver import FakeTopology


@pytest.fixture(autouse=True)
def _fresh_fake_topology() -> Iterator[None]:
    FakeTopology.reset()
    yield
