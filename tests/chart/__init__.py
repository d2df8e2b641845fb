"""Chart tests: helpers shared by the modules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SYNC_CHART = Path(__file__).resolve().parents[2] / "scripts" / "sync_chart.py"


def load_sync_chart() -> ModuleType:
    """scripts/sync_chart.py as a module (scripts/ is not a package)."""
    if "sync_chart" in sys.modules:
        return sys.modules["sync_chart"]
    spec = importlib.util.spec_from_file_location("sync_chart", SYNC_CHART)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sync_chart"] = module
    spec.loader.exec_module(module)
    return module
