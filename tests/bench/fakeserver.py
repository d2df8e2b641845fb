"""Tiny OpenAI-style streaming servers on loopback: a router with its X-PDX headers, and engines.

`FakeEngine` plays a vLLM engine: a plain chat endpoint (what decode serves a request without
`kv_transfer_params` with) and `/metrics` with vLLM's request histograms and NIXL's, fixed
amounts per request so tests can check the arithmetic. A `FakeRouter` given engines books
what each would have counted for the requests it routes.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import orjson
import yaml
from aiohttp import web
from prometheus_client import generate_latest

from pdx_bench.enginemetrics import (
    COMPUTE,
    EXTERNAL,
    HISTOGRAMS,
    LOCAL_HIT,
    POST_TIME,
    PREFILL_TIME,
    QUEUE_TIME,
    SOURCES,
    TTFT,
    XFER_BYTES,
    XFER_TIME,
)
from pdx_router.metrics import Metrics
from pdx_router.policy import Outcome

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local-cpu.yaml"


def example_doc() -> dict[str, Any]:
    """The embedded CPU example, as the fake local topologies are given it."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return doc


class Served(Protocol):
    def app(self) -> web.Application: ...


def _prompt_tokens(body: dict[str, Any]) -> int:
    return sum(len(m["content"].split()) + 4 for m in body["messages"]) + 3


async def _stream(resp: web.StreamResponse, body: dict[str, Any], tag: str, usage: bool) -> None:
    """An answer of `max_tokens` words, then usage and [DONE]."""

    async def send(obj: dict[str, Any]) -> None:
        await resp.write(b"data: " + orjson.dumps(obj) + b"\n\n")

    n = int(body["max_tokens"])
    for i in range(n):
        await send({"choices": [{"index": 0, "delta": {"content": f" {tag}x{i}"}}]})
    if usage:
        await send({"choices": [], "usage": {"prompt_tokens": _prompt_tokens(body), "completion_tokens": n}})
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()


@dataclass
class FakeEngine:
    """A vLLM engine as pdx bench sees it: `/v1/chat/completions`, `/v1/models`, `/metrics`.

    Each request it answers itself books `own` into its histograms (seconds); `book` adds what a
    router's request would have cost it. `exports` lists the histograms its /metrics shows; the
    others it does not export at all. Its figures are split over two label sets (two engines
    behind one API server, as with data parallelism) so that summing is exercised.
    """

    model: str = "pdx-tiny"
    own: dict[str, float] = field(default_factory=lambda: {TTFT: 0.007, QUEUE_TIME: 0.001, PREFILL_TIME: 0.005})
    exports: tuple[str, ...] = HISTOGRAMS
    status: int = 200  # of every chat answer
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)
    # vllm:prompt_tokens_by_source (exported only once a router booked some) and the KV
    # capacity vllm:cache_config_info names (num_gpu_blocks x block_size 16; 0: not said)
    sources: dict[str, float] = field(default_factory=dict)
    capacity_tokens: int = 0

    def book_sources(self, local: float, remote: float, computed: float) -> None:
        for name, value in ((LOCAL_HIT, local), (EXTERNAL, remote), (COMPUTE, computed)):
            self.sources[name] = self.sources.get(name, 0.0) + value

    def book(self, amounts: dict[str, float]) -> None:
        for name, value in amounts.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
            self.counts[name] = self.counts.get(name, 0.0) + 1

    async def chat(self, req: web.Request) -> web.StreamResponse:
        body = orjson.loads(await req.read())
        self.bodies.append(body)
        self.headers.append(dict(req.headers))
        if self.status != 200:
            return web.json_response({"error": {"message": "no"}}, status=self.status)
        self.book(self.own)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        await _stream(resp, body, f"e{len(self.bodies)}", usage=True)
        return resp

    async def metrics(self, _req: web.Request) -> web.Response:
        lines = ["# HELP vllm:num_requests_running Running.", "# TYPE vllm:num_requests_running gauge",
                 'vllm:num_requests_running{engine="0",model_name="m"} 0.0']  # fmt: skip
        for name in self.exports:
            total, count = self.sums.get(name, 0.0), self.counts.get(name, 0.0)
            lines += [f"# HELP {name} Histogram.", f"# TYPE {name} histogram"]
            for engine, share in (("0", 0.25), ("1", 0.75)):
                labels = f'engine="{engine}",model_name="m"'
                lines += [
                    f'{name}_bucket{{{labels},le="+Inf"}} {count * share}',
                    f"{name}_count{{{labels}}} {count * share}",
                    f"{name}_sum{{{labels}}} {total * share}",
                ]
        if self.sources:
            lines += ["# HELP vllm:prompt_tokens_by_source Number of prompt tokens by source.",
                      "# TYPE vllm:prompt_tokens_by_source counter"]  # fmt: skip
            lines += [f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="{source}"}} '
                      f"{self.sources.get(source, 0.0)}" for source in SOURCES]  # fmt: skip
        if self.capacity_tokens:
            blocks = self.capacity_tokens // 16
            info = f'block_size="16",engine="0",num_gpu_blocks="{blocks}"'
            lines += ["# TYPE vllm:cache_config_info gauge", f"vllm:cache_config_info{{{info}}} 1.0"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def models(self, _req: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        return app


# What a routed request costs each engine (seconds); a D->P read only on a hit.
PREFILL_BOOKS = {TTFT: 0.010, QUEUE_TIME: 0.003, PREFILL_TIME: 0.006}
DECODE_BOOKS = {TTFT: 0.008, QUEUE_TIME: 0.004, PREFILL_TIME: 0.002, XFER_TIME: 0.002, POST_TIME: 0.0005}
D2P_BOOKS = {XFER_TIME: 0.004, POST_TIME: 0.001, XFER_BYTES: 1024.0}


@dataclass
class FakeRouter:
    first_token_delay: float = 0.05
    token_delay: float = 0.002
    second_token_delay: float | None = None  # the gap before the second token (default token_delay)
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
    prefill: FakeEngine | None = None  # engines that book what each request costs them
    decode: FakeEngine | None = None
    # router.decodeLocalMaxTokens and decodeLocalMaxBusy: a follow-up turn of at most this many new
    # tokens (its last message, as _prompt_tokens counts) goes `local` while fewer are in flight;
    # decodeLocalIdleMaxTokens: up to this many while none is
    decode_local_max_tokens: int = 0
    decode_local_max_busy: int = 4
    decode_local_idle_max_tokens: int = 0
    in_flight: int = 0
    # A local turn's prefill runs in decode's batch: every stream's next token waits this long.
    local_stall_s: float = 0.0
    stalled_until: float = 0.0  # loop time
    # Prefill's prefix cache (prefill.prefixCaching): each conversation's last prompt, least
    # recently used first, up to `prefill_capacity` tokens; a turn finds its last prompt there
    # (local), reads the rest of its history from decode on a hit (remote), computes the rest.
    prefix_caching: bool = False
    prefill_capacity: int = 1 << 30
    cached: OrderedDict[str, int] = field(default_factory=OrderedDict)
    history: dict[str, int] = field(default_factory=dict)  # each conversation's last prompt + answer

    def _sources(self, conv: str, prompt: int, hit: bool) -> tuple[int, int, int]:
        """(local, remote, computed) tokens of a turn's prompt on prefill; keeps the cache."""
        local = min(prompt, self.cached.pop(conv, 0)) if self.prefix_caching else 0
        remote = max(0, min(prompt, self.history.get(conv, 0)) - local) if hit else 0
        if self.prefix_caching:
            self.cached[conv] = prompt
            while sum(self.cached.values()) > self.prefill_capacity:
                self.cached.popitem(last=False)
        return local, remote, prompt - local - remote

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        return _prompt_tokens(body)

    def _turn(self, body: dict[str, Any]) -> int:
        """By the conversation's id; without one, by the history (its answers), as the router finds it."""
        if "conversation_id" not in body:
            return 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")
        conv = str(body["conversation_id"])
        self.seen[conv] = self.seen.get(conv, 0) + 1
        return self.seen[conv]

    def _outcome(self, body: dict[str, Any], turn: int) -> str:
        if turn == 1 or not self.bidirectional:
            return "miss"
        new = len(body["messages"][-1]["content"].split()) + 4
        if self.decode_local_max_tokens <= 0:
            return "hit"
        short = new <= self.decode_local_max_tokens and self.in_flight < self.decode_local_max_busy
        local = short or (new <= self.decode_local_idle_max_tokens and self.in_flight <= 1)  # itself only
        return "local" if local else "hit"

    async def chat(self, req: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        try:
            return await self._chat(req)
        finally:
            self.in_flight -= 1

    async def _chat(self, req: web.Request) -> web.StreamResponse:
        body = orjson.loads(await req.read())
        self.bodies.append(body)
        self.headers.append(dict(req.headers))
        turn = self._turn(body)
        if self.fail_turn == turn:
            return web.json_response({"error": {"message": "boom"}}, status=500)
        outcome = self._outcome(body, turn)
        hit = outcome == "hit"
        if outcome != "local":  # the fake's metrics know no `local` yet
            self.router_metrics.outcome(Outcome.HIT if hit else Outcome.MISS, 96 if hit else 0)
        if hit:  # the D->P read prefill would do, as its NIXL histogram would count it
            self.xfer_seconds += 0.004
            self.xfer_count += 1
        conv = str(body.get("conversation_id") or next(m["content"] for m in body["messages"] if m["role"] == "user"))
        prompt = self.prompt_tokens(body)
        local, remote, computed = self._sources(conv, prompt, hit)
        self.history[conv] = prompt + int(body["max_tokens"])
        if self.prefill is not None:
            self.prefill.book({**PREFILL_BOOKS, **(D2P_BOOKS if hit else {})})
            self.prefill.book_sources(local, remote, computed)
        if self.decode is not None:
            self.decode.book(DECODE_BOOKS)
        facts = {
            "X-PDX-Prefill-Ms": "12.5" if hit else "40.0",
            "X-PDX-Router-Ms": "1.5" if hit else "0.5",  # a hit's claim on decode's hold
            "X-PDX-Reuse": outcome,
            "X-PDX-Reused-Tokens": "96" if hit else "0",
        }
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", **(facts if self.reuse_headers else {})}
        )
        await resp.prepare(req)

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(b"data: " + orjson.dumps(obj) + b"\n\n")

        await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        loop = asyncio.get_running_loop()
        if outcome == "local":
            self.stalled_until = max(self.stalled_until, loop.time() + self.local_stall_s)
        await asyncio.sleep(self.first_token_delay + self.per_token_delay * computed)
        n = int(body["max_tokens"])
        for i in range(n):
            if i:
                gap = self.second_token_delay if i == 1 and self.second_token_delay is not None else self.token_delay
                await asyncio.sleep(gap)
            await asyncio.sleep(max(0.0, self.stalled_until - loop.time()))
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


F = TypeVar("F", bound=Served)


class ThreadedFake(Generic[F]):
    """A fake on its own event loop in a thread: for code that calls asyncio.run itself."""

    def __init__(self, fake: F) -> None:
        self.fake = fake
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._cm: Any = None

    def __enter__(self) -> ThreadedFake[F]:
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
async def serve(fake: Served) -> AsyncIterator[str]:
    runner = web.AppRunner(fake.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


class FakeTopology:
    """Stands in for pdx.local.topology.LocalTopology: same constructor and attributes.

    A fake router in front of a fake prefill and a fake decode engine, each on its own port.
    `with_decode = False` leaves decode's URL out, as a topology that did not name it.
    """

    started: ClassVar[list[dict[str, Any]]] = []
    reconfigured: ClassVar[list[dict[str, Any]]] = []  # documents whose router alone was restarted
    models: ClassVar[set[str]] = set()
    decodes: ClassVar[list[FakeEngine]] = []
    routers: ClassVar[list[FakeRouter]] = []
    with_decode: ClassVar[bool] = True
    token_delay: ClassVar[float] = 0.0  # of the router's answers
    local_stall_s: ClassVar[float] = 0.0  # what a local turn stalls decode's streams by
    prefill_capacity: ClassVar[int] = 1 << 20  # tokens prefill's prefix cache holds

    def __init__(self, document: dict[str, Any], state_dir: Path | None = None) -> None:
        self.document = document
        bidir = bool(document["spec"]["kvTransfer"]["bidirectional"])
        self.prefill, self.decode = FakeEngine(capacity_tokens=FakeTopology.prefill_capacity), FakeEngine()
        caching = document["spec"].get("prefill", {}).get("prefixCaching")
        if caching is None:  # the models' default: on, but under profile benchmark
            caching = document["spec"].get("profile") != "benchmark"
        self._fake = ThreadedFake(
            FakeRouter(
                first_token_delay=0.002,
                token_delay=FakeTopology.token_delay,
                local_stall_s=FakeTopology.local_stall_s,
                bidirectional=bidir,
                per_token_delay=2e-6,
                prefill=self.prefill,
                decode=self.decode,
                prefix_caching=bool(caching),
                prefill_capacity=FakeTopology.prefill_capacity,
            )
        )
        self._engines = (ThreadedFake(self.prefill), ThreadedFake(self.decode))
        self.model_dir = Path("/nonexistent-model-dir")
        self._router_fields(document)

    def _router_fields(self, document: dict[str, Any]) -> None:
        router = document["spec"].get("router", {})
        self._fake.fake.decode_local_max_tokens = int(router.get("decodeLocalMaxTokens", 0))
        self._fake.fake.decode_local_max_busy = int(router.get("decodeLocalMaxBusy", 4))
        self._fake.fake.decode_local_idle_max_tokens = int(router.get("decodeLocalIdleMaxTokens", 0))

    def reconfigure_router(self, document: dict[str, Any]) -> None:
        """A new router process: the new fields, no entries; the engines are the same."""
        FakeTopology.reconfigured.append(document)
        self._router_fields(document)
        self._fake.fake.seen.clear()

    @classmethod
    def reset(cls) -> None:
        cls.started, cls.reconfigured, cls.models, cls.decodes, cls.routers = [], [], set(), [], []
        cls.with_decode, cls.token_delay, cls.local_stall_s = True, 0.0, 0.0
        cls.prefill_capacity = 1 << 20

    def __enter__(self) -> FakeTopology:
        FakeTopology.started.append(self.document)
        for engine in self._engines:
            engine.__enter__()
        self._fake.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._fake.__exit__()
        for engine in self._engines:
            engine.__exit__()
        FakeTopology.models |= {str(b["model"]) for b in self._fake.fake.bodies}
        FakeTopology.decodes.append(self.decode)
        FakeTopology.routers.append(self._fake.fake)

    @property
    def router_url(self) -> str:
        return self._fake.url

    @property
    def engine_urls(self) -> dict[str, list[str]]:
        decode = [self._engines[1].url] if self.with_decode else []
        return {"prefill": [self._engines[0].url], "decode": decode}

    def peak_rss_mib(self) -> dict[str, float]:
        return {"local-prefill-0": 4608.0, "local-router-0": 41.0}
