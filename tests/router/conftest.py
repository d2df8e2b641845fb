"""Fixtures: fake engines on loopback, routers in front of them, a real redis-server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from pdx.local.topology import free_port
from pdx_contract.router_config import TenancyConfig
from pdx_router.app import Router, Serving, build
from pdx_router.config import RouterConfig
from pdx_router.store import Store
from pdx_router.testing.fake_engine import Cluster, EngineOptions, FakeEngine, start_engine


@dataclass
class Stack:
    cluster: Cluster
    prefills: list[FakeEngine]
    decodes: list[FakeEngine]
    prefill_urls: list[str]
    decode_urls: list[str]
    routers: list[Router] = field(default_factory=list)
    router_urls: list[str] = field(default_factory=list)
    runners: list[web.AppRunner] = field(default_factory=list)  # the fake engines'
    servings: list[Serving] = field(default_factory=list)  # the routers'

    @property
    def url(self) -> str:
        return self.router_urls[0]

    @property
    def router(self) -> Router:
        return self.routers[0]

    @property
    def prefill(self) -> FakeEngine:
        return self.prefills[0]

    @property
    def decode(self) -> FakeEngine:
        return self.decodes[0]


async def start_router(
    cfg: RouterConfig, host: str = "127.0.0.1", store: Store | None = None
) -> tuple[Router, Serving, str]:
    serving = build(cfg, store)
    port = await serving.start(host, 0)
    shown = f"[{host}]" if ":" in host else host
    return serving.router, serving, f"http://{shown}:{port}"


StackFactory = Callable[..., Awaitable[Stack]]


@pytest.fixture
async def make_stack() -> AsyncIterator[StackFactory]:
    stacks: list[Stack] = []

    async def factory(
        n_prefill: int = 1,
        n_decode: int = 1,
        routers: int = 1,
        host: str = "127.0.0.1",
        cluster: Cluster | None = None,
        prefill_opts: dict[str, Any] | None = None,
        decode_opts: dict[str, Any] | None = None,
        **cfg_changes: Any,
    ) -> Stack:
        cl = cluster or Cluster()
        stack = Stack(cl, [], [], [], [])
        stacks.append(stack)
        for i in range(n_prefill):
            opts = EngineOptions("prefill", f"prefill-{i}", **(prefill_opts or {}))
            eng, runner, url = await start_engine(cl, opts, host)
            stack.prefills.append(eng)
            stack.prefill_urls.append(url)
            stack.runners.append(runner)
        for i in range(n_decode):
            opts = EngineOptions("decode", f"decode-{i}", **(decode_opts or {}))
            eng, runner, url = await start_engine(cl, opts, host)
            stack.decodes.append(eng)
            stack.decode_urls.append(url)
            stack.runners.append(runner)
        settings: dict[str, Any] = {
            "served_model_name": "Qwen",
            "generation": "g1",
            "prefill": tuple(stack.prefill_urls),
            "decode": tuple(stack.decode_urls),
            "kv_recompute_threshold": 8,
            "health_check_interval_seconds": 60,
            # One trusted client that reads the reuse facts, as in the local demo; the
            # tenancy tests set their own.
            "tenancy": TenancyConfig(identity="single"),
            "reuse_headers": True,
        }
        cfg = RouterConfig(**{**settings, **cfg_changes})
        for _ in range(routers):
            router, serving, url = await start_router(cfg, host)
            stack.routers.append(router)
            stack.router_urls.append(url)
            stack.servings.append(serving)
        return stack

    yield factory
    for stack in stacks:
        for serving in stack.servings:
            await serving.close()
        for runner in reversed(stack.runners):
            await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A throwaway redis-server on loopback (CI installs redis-server)."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not on PATH (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)
