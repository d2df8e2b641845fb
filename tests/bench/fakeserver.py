"""A tiny OpenAI-style streaming server with the router's X-PDX headers, on loopback."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import generate_latest

from pdx_router.metrics import Metrics
from pdx_router.policy import Outcome


@dataclass
class FakeRouter:
    first_token_delay: float = 0.05
    token_delay: float = 0.002
    fail_turn: int | None = None  # answer 500 on this turn (1-based, any conversation)
    bidirectional: bool = True  # off: every turn is a miss and pays per prompt token
    per_token_delay: float = 0.0  # recompute cost per prompt token when a turn is not a hit
    send_usage: bool = True
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)
    xfer_seconds: float = 0.0
    xfer_count: int = 0
    reuse_headers: bool = True  # off: as a deployment without router.reuseHeaders
    router_metrics: Metrics = field(default_factory=Metrics)  # the router's own, on /metrics

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        return sum(len(m["content"].split()) + 4 for m in body["messages"]) + 3

    async def chat(self, req: web.Request) -> web.StreamResponse:
        body = orjson.loads(await req.read())
        self.bodies.append(body)
        self.headers.append(dict(req.headers))
        conv = str(body.get("conversation_id"))
        turn = self.seen.get(conv, 0) + 1
        self.seen[conv] = turn
        if self.fail_turn == turn:
            return web.json_response({"error": {"message": "boom"}}, status=500)
        hit = turn > 1 and self.bidirectional
        self.router_metrics.outcome(Outcome.HIT if hit else Outcome.MISS, 96 if hit else 0)
        if hit:  # the D->P read prefill would do, as its NIXL histogram would count it
            self.xfer_seconds += 0.004
            self.xfer_count += 1
        facts = {
            "X-PDX-Prefill-Ms": "12.5" if hit else "40.0",
            "X-PDX-Reuse": "hit" if hit else "miss",
            "X-PDX-Reused-Tokens": "96" if hit else "0",
        }
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", **(facts if self.reuse_headers else {})}
        )
        await resp.prepare(req)

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(b"data: " + orjson.dumps(obj) + b"\n\n")

        await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        await asyncio.sleep(self.first_token_delay + (0 if hit else self.per_token_delay * self.prompt_tokens(body)))
        n = int(body["max_tokens"])
        for i in range(n):
            if i:
                await asyncio.sleep(self.token_delay)
            await send({"choices": [{"index": 0, "delta": {"content": f" w{turn}x{i}"}}]})
        usage = {"prompt_tokens": self.prompt_tokens(body), "completion_tokens": n, "total_tokens": 0}
        if self.send_usage:
            await send({"choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def metrics(self, _req: web.Request) -> web.Response:
        text = (
            "# HELP vllm:nixl_xfer_time_seconds Histogram of transfer duration.\n"
            "# TYPE vllm:nixl_xfer_time_seconds histogram\n"
            f'vllm:nixl_xfer_time_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {self.xfer_count}.0\n'
            f'vllm:nixl_xfer_time_seconds_count{{engine="0",model_name="m"}} {self.xfer_count}.0\n'
            f'vllm:nixl_xfer_time_seconds_sum{{engine="0",model_name="m"}} {self.xfer_seconds}\n'
            "# HELP vllm:nixl_bytes_transferred Bytes.\n"
            "# TYPE vllm:nixl_bytes_transferred histogram\n"
            f'vllm:nixl_bytes_transferred_count{{engine="0",model_name="m"}} {self.xfer_count}.0\n'
            f'vllm:nixl_bytes_transferred_sum{{engine="0",model_name="m"}} {self.xfer_count * 1024.0}\n'
        )
        return web.Response(
            text=text + generate_latest(self.router_metrics.registry).decode(), content_type="text/plain"
        )

    async def models(self, _req: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def stats(self, _req: web.Request) -> web.Response:
        return web.json_response({"reuse": {"hit": sum(max(0, t - 1) for t in self.seen.values())}})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/pdx/stats", self.stats)
        return app


class ThreadedFake:
    """A FakeRouter on its own event loop in a thread: for code that calls asyncio.run itself."""

    def __init__(self, fake: FakeRouter) -> None:
        self.fake = fake
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._cm: Any = None

    def __enter__(self) -> ThreadedFake:
        self._thread.start()
        self._cm = serve(self.fake)
        self.url = asyncio.run_coroutine_threadsafe(self._cm.__aenter__(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._cm.__aexit__(None, None, None), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@asynccontextmanager
async def serve(fake: FakeRouter) -> AsyncIterator[str]:
    runner = web.AppRunner(fake.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
