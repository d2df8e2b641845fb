"""How long the fuzz tests run. `make test` runs the CI profile: a fixed number of examples a
target, derandomized (the same inputs every run, so a failure reproduces and a pass is no
luck), within its time bound. PDX_FUZZ_EXAMPLES scales it for a longer run by hand; the long
run proper (millions of inputs) is scripts/fuzz.py, which shares these targets' checks."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir

_SCALE = float(os.environ.get("PDX_FUZZ_EXAMPLES", "1"))
# Hypothesis keeps a cache beside the tests unless told otherwise: not in the checkout.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "pdx-hypothesis")


def fuzz(examples: int) -> settings:
    """Settings for one target: `examples` in CI (times PDX_FUZZ_EXAMPLES)."""
    return settings(
        max_examples=max(1, int(examples * _SCALE)),
        deadline=None,  # (a shared machine's pauses are no bug)
        derandomize=_SCALE == 1,
        database=None,  # nothing written into the checkout
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    )
