"""Fixtures for the fault suite: the router tests' stacks, engines and redis-server, and the
suite's figures at the end of the session."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from pdx.local.topology import free_port
from pdx_router.testing.fake_engine import Cluster, EngineOptions, FakeEngine
from tests.faults.tally import TALLY
from tests.router.conftest import http, make_stack  # noqa: F401  (fixtures)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TALLY.injected:
        return
    terminalreporter.section("pdx fault suite")
    for line in TALLY.lines():
        terminalreporter.write_line(line)


class KillableEngine:
    """A fake engine whose server can be killed (connections cut, no graceful drain) and
    started again on the same port."""

    def __init__(self, cluster: Cluster, opts: EngineOptions) -> None:
        self.cluster, self.opts = cluster, opts
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.engine: FakeEngine | None = None
        self.runner: web.AppRunner | None = None

    async def start(self) -> FakeEngine:
        self.engine = FakeEngine(self.cluster, self.opts)
        self.runner = web.AppRunner(self.engine.app, handler_cancellation=True, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self.engine

    async def kill(self) -> None:
        assert self.runner is not None and self.runner.server is not None
        for proto in list(self.runner.server.connections):
            if proto.transport is not None:
                proto.transport.abort()
        await self.runner.cleanup()
        self.runner = None


@pytest.fixture
async def killable() -> AsyncIterator[list[KillableEngine]]:
    engines: list[KillableEngine] = []
    yield engines
    for e in engines:
        if e.runner is not None:
            await e.runner.cleanup()
