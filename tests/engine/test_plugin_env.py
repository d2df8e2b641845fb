"""The plugins' environment knobs: unset changes nothing, bad values name the variable and the fix."""

from __future__ import annotations

import re

import pytest

from pdx_engine import idle_wait, nixl_progress, shm_recheck
from pdx_engine.plugin_env import positive_int

KNOBS = [
    (nixl_progress.ENV, nixl_progress.delay_from_env, "microseconds", 1000, 1000),
    (idle_wait.ENV, idle_wait.wait_from_env, "milliseconds", 3000, 3.0),
    (shm_recheck.ENV, shm_recheck.recheck_from_env, "milliseconds", 2, 2),
    (shm_recheck.BUSY_ENV, shm_recheck.busy_loop_from_env, "milliseconds", 20, 20),
]


@pytest.mark.parametrize(("name", "read", "unit", "raw", "value"), KNOBS)
def test_each_knob_reads_its_variable(name: str, read: object, unit: str, raw: int, value: float) -> None:
    assert callable(read)
    assert read({name: f" {raw} "}) == value
    assert read({}) is None
    assert read({name: ""}) is None


@pytest.mark.parametrize(("name", "read", "unit", "raw", "value"), KNOBS)
@pytest.mark.parametrize("bad", ["0", "-1", "2s", "0.5", "1e3"])
def test_bad_values_name_the_variable_and_the_fix(
    name: str, read: object, unit: str, raw: int, value: float, bad: str
) -> None:
    assert callable(read)
    expected = rf"^{name}='{re.escape(bad)}': expected a whole number of {unit} >= 1, or unset it$"
    with pytest.raises(ValueError, match=expected):
        read({name: bad})


def test_positive_int_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDX_TEST_KNOB", "7")
    assert positive_int("PDX_TEST_KNOB", "things") == 7
