"""Fixtures for the built-image tests: the images (built or cached). The operator image runs
against the session's real control plane (``control_plane``, ``cluster``: tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.images import buildah

_BUILT: dict[str, buildah.Image] = {}


@pytest.fixture(scope="session")
def images() -> dict[str, buildah.Image]:
    """Both images, built by scripts/build-images.sh (seconds when cached; `make images`), which
    installs buildah first; skipped, with the reason, only where that install fails."""
    built = buildah.build()
    if isinstance(built, str):
        pytest.skip(f"buildah cannot be installed here: {built}")
    assert set(built) == {"operator", "router"}, built
    _BUILT.update(built)
    return built


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for image in _BUILT.values():
        terminalreporter.write_line(f"image {image.ref}: {image.size}")
