"""Fixtures for the fault suite: the router tests' stacks, engines and redis-server, and the
suite's figures at the end of the session."""

from __future__ import annotations

import pytest

from tests.faults.tally import TALLY
from tests.router.conftest import http, make_stack  # noqa: F401  (fixtures)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TALLY.injected:
        return
    terminalreporter.section("pdx fault suite")
    for line in TALLY.lines():
        terminalreporter.write_line(line)
