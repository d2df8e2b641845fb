"""Chart tests: helpers shared by the modules."""

from __future__ import annotations

from types import ModuleType

from tests.support.scripts import load_script


def load_sync_chart() -> ModuleType:
    """scripts/sync_chart.py as a module."""
    return load_script("sync_chart")
