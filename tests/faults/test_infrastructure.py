"""Infrastructure faults: Redis, a router restart, decode dying mid-stream, prefill hanging,
a refused read, a client that goes away, a slow client, and a soak.

Each fault is injected, then checked: what the client got, what was stored, what the
metrics say, and that the router keeps serving. Figures go to tests/faults/tally.py.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from pdx.local.topology import free_port
from pdx_contract.router_config import TenancyConfig
from pdx_router.config import RouterConfig, StoreConfig
from pdx_router.store import MemoryStore
from pdx_router.testing.fake_engine import Cluster, EngineOptions
from tests.faults.conftest import KillableEngine
from tests.faults.tally import TALLY
from tests.router.conftest import StackFactory, start_router
from tests.router.helpers import LONG, assistant, user

pytestmark = pytest.mark.faults

CHAT = "/v1/chat/completions"


# ---------------------------------------------------------------- helpers


@dataclass
class Conversation:
    """One client's conversation: each turn adds the answer and a new question."""

    cid: str
    messages: list[dict[str, Any]] = field(default_factory=lambda: [user(LONG)])
    n: int = 0

    async def turn(
        self, http: aiohttp.ClientSession, url: str, stream: bool = False, expect_ok: bool = True
    ) -> tuple[int, dict[str, str], Any]:
        body = {"model": "Qwen", "messages": self.messages, "stream": stream, "conversation_id": self.cid}
        TALLY.turns += 1
        try:
            async with asyncio.timeout(20):
                async with http.post(url + CHAT, json=body) as r:
                    raw = await r.read()
                    status, headers = r.status, dict(r.headers)
        except TimeoutError:
            TALLY.lost += 1
            raise
        if status != 200:
            if expect_ok:
                TALLY.lost += 1
            return status, headers, raw
        if stream:
            lines = [ln for ln in raw.split(b"\n") if ln.startswith(b"data: ")]
            text = "".join(
                (c.get("delta") or {}).get("content") or ""
                for ln in lines
                if ln != b"data: [DONE]"
                for c in orjson.loads(ln[6:]).get("choices", [])
            )
            data: Any = lines
        else:
            data = orjson.loads(raw)
            text = data["choices"][0]["message"]["content"]
        self.n += 1
        self.messages = [*self.messages, assistant(text.strip()), user(f"and then {self.n}?")]
        return status, headers, data


async def stats(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/v1/pdx/stats") as r:
        assert r.status == 200
        doc: dict[str, Any] = orjson.loads(await r.read())
        return doc


async def metric(http: aiohttp.ClientSession, url: str, name: str) -> float:
    """The sum of a Prometheus sample over its label sets (0 if absent)."""
    async with http.get(url + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def tally_reads(cluster: Cluster) -> None:
    TALLY.reads += len(cluster.reads)
    TALLY.wrong_kv += sum(not r.correct for r in cluster.reads)


async def until(cond: Any, timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class RedisServer:
    """A redis-server on loopback that the test can kill and start again on the same port."""

    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.skip("redis-server is not on PATH (apt-get install redis-server)")
        self.exe = exe
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    srv = RedisServer()
    srv.start()
    yield srv
    if srv.proc is not None:
        srv.kill()


def injected(name: str) -> str:
    TALLY.injected.append(name)
    return name


def survived(name: str) -> None:
    TALLY.survived.append(name)


# ---------------------------------------------------------------- Redis


async def test_redis_killed_mid_run_then_restarted(
    make_stack: StackFactory, http: aiohttp.ClientSession, redis_server: RedisServer
) -> None:
    s = await make_stack(store=StoreConfig(kind="redis", url=redis_server.url, key_prefix="pdx-faults-a:"))
    conv = Conversation("redis-1")
    assert (await conv.turn(http, s.url))[1]["X-PDX-Reuse"] == "miss"
    assert (await conv.turn(http, s.url))[1]["X-PDX-Reuse"] == "hit"

    fault = injected("redis killed mid-run")
    redis_server.kill()
    for _ in range(3):
        t0 = time.perf_counter()
        status, headers, _ = await conv.turn(http, s.url)
        assert status == 200, "a store outage must degrade to plain P/D, not fail the turn"
        assert headers["X-PDX-Reuse"] == "miss"  # no entry can be read while Redis is down
        assert time.perf_counter() - t0 < 3.0
    status, headers, lines = await conv.turn(http, s.url, stream=True)
    assert status == 200 and lines[-1] == b"data: [DONE]"
    doc = await stats(http, s.url)  # still answers while the store is down
    assert doc["reuse"]["hit"] == 1
    assert await metric(http, s.url, "pdx_router_store_errors_total") >= 8  # a take and a put per turn

    redis_server.start()  # same port: the client reconnects by itself
    assert (await conv.turn(http, s.url))[1]["X-PDX-Reuse"] == "miss"  # nothing was stored meanwhile
    assert (await conv.turn(http, s.url))[1]["X-PDX-Reuse"] == "hit"  # reuse resumes
    assert (await stats(http, s.url))["entries"] == 1
    tally_reads(s.cluster)
    assert all(r.correct for r in s.cluster.reads) and len(s.cluster.reads) == 2
    survived(fault)


async def test_redis_frozen_costs_a_turn_about_a_second(
    make_stack: StackFactory, http: aiohttp.ClientSession, redis_server: RedisServer
) -> None:
    """A Redis that hangs (SIGSTOP: connections open, no answers) is worse than a dead one:
    each call waits for the socket timeout. The store's timeouts bound what a turn pays."""
    s = await make_stack(store=StoreConfig(kind="redis", url=redis_server.url, key_prefix="pdx-faults-f:"))
    conv = Conversation("frozen-1")
    assert (await conv.turn(http, s.url))[1]["X-PDX-Reuse"] == "miss"
    fault = injected("redis frozen (SIGSTOP)")
    assert redis_server.proc is not None
    redis_server.proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.perf_counter()
        status, headers, _ = await conv.turn(http, s.url)
        elapsed = time.perf_counter() - t0
        assert status == 200 and headers["X-PDX-Reuse"] == "miss"
        assert elapsed < 3.0, elapsed  # a take and a put, each at most the store's 1 s timeout
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    await conv.turn(http, s.url)  # the connections come back (or are remade)
    status, headers, _ = await conv.turn(http, s.url)
    assert status == 200 and headers["X-PDX-Reuse"] == "hit"
    assert await metric(http, s.url, "pdx_router_store_errors_total") >= 2
    tally_reads(s.cluster)
    assert all(r.correct for r in s.cluster.reads)
    survived(fault)


class RouterProcess:
    """`pdx-router` (the installed console script) as its own process on a fixed port: it can
    be killed with SIGKILL, losing whatever it held in memory, and started again as it was."""

    def __init__(self, args: list[str]) -> None:
        exe = Path(sysconfig.get_path("scripts")) / "pdx-router"
        if not exe.exists():
            pytest.skip(f"{exe} is missing: install the router (pip install -e router)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [str(exe), "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self, timeout: float = 30.0) -> None:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as http:
            while True:
                assert self.proc.poll() is None, f"pdx-router exited with {self.proc.returncode}"
                try:
                    async with http.get(self.url + "/ready") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, "pdx-router did not become ready"
                await asyncio.sleep(0.1)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def router_processes() -> Iterator[list[RouterProcess]]:
    procs: list[RouterProcess] = []
    yield procs
    for proc in procs:
        proc.stop()


async def test_router_process_killed_mid_run_restarts_on_redis_and_reuses(
    make_stack: StackFactory,
    http: aiohttp.ClientSession,
    redis_server: RedisServer,
    router_processes: list[RouterProcess],
) -> None:
    """SIGKILL, not a graceful stop: the router's memory and its connections go at once.
    Turns in flight end with an error the client can tell from an answer; the entries the
    router stored in Redis before the kill are reused by the router that comes back."""
    s = await make_stack(routers=0, decode_opts={"output_tokens": 40})
    engines = ["--prefill", s.prefill_urls[0], "--decode", s.decode_urls[0], "--redis-url", redis_server.url]
    trusted = ["--tenancy", "single", "--reuse-headers"]  # one client that reads the reuse facts
    router = RouterProcess([*engines, "--model", "Qwen", "--generation", "g1", "--threshold", "8", *trusted])
    router_processes.append(router)
    await router.start()
    idle = [Conversation(f"restart-idle-{i}") for i in range(3)]  # between turns at the kill
    busy = [Conversation(f"restart-busy-{i}") for i in range(2)]  # mid-turn at the kill
    for conv in idle + busy:
        assert (await conv.turn(http, router.url))[1]["X-PDX-Reuse"] == "miss"
        assert (await conv.turn(http, router.url))[1]["X-PDX-Reuse"] == "hit"

    fault = injected("router process killed (SIGKILL) mid-run, restarted on Redis")
    s.decode.opts.token_delay = 0.05  # 2 s streams, to kill the router in the middle of
    responses = []
    for conv in busy:
        body = {"model": "Qwen", "messages": conv.messages, "stream": True, "conversation_id": conv.cid}
        TALLY.turns += 1
        r = await http.post(router.url + CHAT, json=body)
        assert r.status == 200 and r.headers["X-PDX-Reuse"] == "hit"
        got = b""
        while got.count(b"data: ") < 3:
            got += await r.content.readany()
        responses.append((r, got))
    router.kill()
    for r, got in responses:
        async with asyncio.timeout(5):  # the client is not left hanging
            with pytest.raises(aiohttp.ClientPayloadError):  # the stream is cut, not ended
                got += await r.content.read()
        assert b"data: [DONE]" not in got
        r.close()
        TALLY.cut += 1
    await until(lambda: s.decode.cancelled == len(busy), what="decode to see the streams aborted")
    s.decode.opts.token_delay = 0.0

    await router.start()  # the same flags, port and Redis: as its pod would come back
    # What was stored before the kill is there; the turns in flight had taken theirs.
    assert (await stats(http, router.url))["entries"] == len(idle)
    for conv in idle:  # their entries, stored before the kill, are in Redis
        status, headers, _ = await conv.turn(http, router.url)
        assert status == 200 and headers["X-PDX-Reuse"] == "hit", headers
    for conv in busy:  # the killed turn had taken its entry and stored nothing: recomputed
        status, headers, _ = await conv.turn(http, router.url, stream=True)
        assert status == 200 and headers["X-PDX-Reuse"] == "miss", headers
        status, headers, _ = await conv.turn(http, router.url)
        assert status == 200 and headers["X-PDX-Reuse"] == "hit", headers
    doc = await stats(http, router.url)  # the new process counts only its own turns
    assert doc["reuse"]["hit"] == len(idle) + len(busy) and doc["reuse"]["miss"] == len(busy), doc["reuse"]
    assert doc["entries"] == len(idle) + len(busy)
    assert await metric(http, router.url, "pdx_router_reuse_total") == len(idle) + 2 * len(busy)
    assert await metric(http, router.url, "pdx_router_store_errors_total") == 0
    tally_reads(s.cluster)
    assert len(s.cluster.reads) == 2 * len(idle) + 3 * len(busy)  # every hit was a D->P read
    assert all(r.correct for r in s.cluster.reads)
    survived(fault)


# ---------------------------------------------------------------- engines


async def test_decode_killed_mid_stream(
    make_stack: StackFactory, http: aiohttp.ClientSession, killable: list[KillableEngine]
) -> None:
    cl = Cluster()
    for i in range(2):
        k = KillableEngine(cl, EngineOptions("decode", f"decode-{i}", output_tokens=40))
        await k.start()
        killable.append(k)
    s = await make_stack(
        n_decode=0, cluster=cl, decode=tuple(k.url for k in killable), health_check_interval_seconds=0.1
    )
    conv = Conversation("dies-1")
    await conv.turn(http, s.url)  # an entry on one decode
    assert (await stats(http, s.url))["entries"] == 1

    fault = injected("decode killed mid-stream")
    for k in killable:
        k.opts.token_delay = 0.05  # a slow stream to kill in the middle of
    body = {"model": "Qwen", "messages": conv.messages, "stream": True, "conversation_id": conv.cid}
    TALLY.turns += 1
    t0 = time.perf_counter()
    got = b""
    async with asyncio.timeout(10):  # no hang
        async with http.post(s.url + CHAT, json=body) as r:
            assert r.status == 200 and r.headers["X-PDX-Reuse"] == "hit"
            while got.count(b"data: ") < 3:
                got += await r.content.readany()
            victim = next(
                k
                for k in killable
                if k.engine is not None and k.engine.requests[-1:] and k.engine.requests[-1][1].get("stream")
            )
            await victim.kill()
            got += await r.content.read()
    elapsed = time.perf_counter() - t0
    events = [ln for ln in got.split(b"\n") if ln.startswith(b"data: ")]
    assert b"data: [DONE]" not in events  # the answer is not passed off as complete
    err = orjson.loads(events[-1][6:])
    assert "error" in err and "decode" in err["error"]["message"], err
    assert "http://" not in err["error"]["message"], err
    TALLY.expected_errors += 1
    assert elapsed < 5
    assert (await stats(http, s.url))["entries"] == 0  # nothing stored for the broken turn
    assert await metric(http, s.url, "pdx_router_upstream_errors_total") >= 1

    for k in killable:
        k.opts.token_delay = 0.0
    dead = next(ep for ep in s.router.pool.endpoints if ep.url == victim.url)
    await until(lambda: not dead.healthy, what="the dead decode taken out")
    other = next(k for k in killable if k is not victim)
    assert other.engine is not None
    before = len(other.engine.requests)
    status, headers, _ = await conv.turn(http, s.url)  # the next turn, on the other decode
    assert status == 200 and headers["X-PDX-Reuse"] == "miss"
    assert len(other.engine.requests) == before + 1

    await victim.start()  # the decode comes back on its address
    await until(lambda: dead.healthy, what="the decode back in")
    for _ in range(2):
        status, _, _ = await conv.turn(http, s.url, stream=True)
        assert status == 200
    tally_reads(cl)
    assert all(r.correct for r in cl.reads)
    survived(fault)


async def test_prefill_hanging_ends_at_the_timeout_with_504(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts={"prefill_delay": 60.0}, upstream_timeout_seconds=0.5)
    fault = injected("prefill hanging")
    conv = Conversation("hang-1")
    for stream in (False, True):
        t0 = time.perf_counter()
        status, _, raw = await conv.turn(http, s.url, stream=stream, expect_ok=False)
        elapsed = time.perf_counter() - t0
        assert status == 504, (status, raw)
        TALLY.expected_errors += 1
        message = orjson.loads(raw)["error"]["message"]
        assert "prefill" in message and "timed out" in message and "upstreamTimeoutSeconds" in message, message
        assert "http://" not in message, message  # the engine's address goes to the log only
        assert 0.45 < elapsed < 0.9, elapsed  # one timeout, not one per try
    assert s.prefill.cancelled >= 1  # the engine saw the request go
    assert await metric(http, s.url, "pdx_router_upstream_errors_total") == 2
    assert all(ep.healthy for ep in s.router.pool.endpoints)  # slow is not gone
    s.prefill.opts.prefill_delay = 0.0  # it recovers
    status, headers, _ = await conv.turn(http, s.url)
    assert status == 200 and headers["X-PDX-Reuse"] == "miss"
    survived(fault)


async def test_decode_read_refused_is_retried_without_reuse(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(prefill_opts={"fail_reads": True})
    conv = Conversation("refused-1")
    await conv.turn(http, s.url)
    fault = injected("decode's KV read refused (500)")
    for stream in (False, True):
        status, headers, _ = await conv.turn(http, s.url, stream=stream)
        assert status == 200 and headers["X-PDX-Reuse"] == "declined"
        assert headers["X-PDX-Reused-Tokens"] == "0"
    assert (await stats(http, s.url))["reuse"]["declined"] == 2
    assert await metric(http, s.url, "pdx_router_upstream_errors_total") == 2
    assert (await stats(http, s.url))["entries"] == 1  # the retried turn is kept
    tally_reads(s.cluster)
    assert len(s.cluster.reads) == 2 and all(r.correct for r in s.cluster.reads)
    survived(fault)


# ---------------------------------------------------------------- clients


@pytest.mark.parametrize("during", ["decode", "prefill"])
async def test_client_disconnect_mid_stream_aborts_the_engines(
    make_stack: StackFactory, http: aiohttp.ClientSession, during: str
) -> None:
    s = await make_stack(decode_opts={"output_tokens": 60})
    conv = Conversation(f"leaves-{during}")
    await conv.turn(http, s.url)
    s.decode.opts.token_delay = 0.05  # a slow stream to leave in the middle of
    fault = injected(f"client disconnected during {during}")
    if during == "prefill":
        s.prefill.opts.prefill_delay = 30.0
    body = {"model": "Qwen", "messages": conv.messages, "stream": True, "conversation_id": conv.cid}
    TALLY.turns += 1
    async with asyncio.timeout(5):
        r = await http.post(s.url + CHAT, json=body) if during == "decode" else None
        if r is not None:
            assert r.status == 200
            await r.content.readany()
            r.close()  # the client goes away mid-stream
        else:
            seen = len(s.prefill.requests)
            task = asyncio.create_task(http.post(s.url + CHAT, json=body))
            await until(lambda: any(p != "/tokenize" for p, _ in s.prefill.requests[seen:]), what="prefill")
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    engine = s.decode if during == "decode" else s.prefill
    await until(lambda: engine.cancelled == 1, what=f"{during} to see the request aborted")
    assert (await stats(http, s.url))["entries"] == 0  # the entry was taken, nothing stored
    s.prefill.opts.prefill_delay = s.decode.opts.token_delay = 0.0
    status, headers, _ = await conv.turn(http, s.url)
    assert status == 200 and headers["X-PDX-Reuse"] == "miss"
    tally_reads(s.cluster)
    assert all(r.correct for r in s.cluster.reads)
    survived(fault)


def _rss(pid: int | None = None) -> int:
    """Resident set size in bytes, from /proc (Linux, as CI)."""
    with open(f"/proc/{pid or 'self'}/status") as fh:
        kb = next(line.split()[1] for line in fh if line.startswith("VmRSS:"))
    return int(kb) * 1024


async def test_slow_client_keeps_router_memory_bounded(make_stack: StackFactory) -> None:
    """A router process streams a ~20 MB answer to a client that stops reading: aiohttp's
    write backpressure stops the router reading decode, so decode cannot finish while the
    client stalls and the router's RSS does not grow with the answer."""
    tokens = 120_000
    s = await make_stack(routers=0, decode_opts={"output_tokens": tokens})
    router = RouterProcess(
        ["--prefill", s.prefill_urls[0], "--decode", s.decode_urls[0], "--model", "Qwen", "--generation", "g1"]
    )
    port = router.port
    await router.start()
    assert router.proc is not None
    proc = router.proc
    fault = injected("slow client")
    try:
        base = _rss(proc.pid)
        sock = socket.socket()
        # No small SO_RCVBUF: a window below loopback's 64 KiB MSS can stall TCP on zero-window
        # probes. The kernel's buffers, default sized, hold far less than the answer anyway.
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=16384)
        body = orjson.dumps({"model": "Qwen", "messages": [user(LONG)], "stream": True})
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        TALLY.turns += 1
        got = len(await reader.read(8192))
        peak = base
        for _ in range(20):  # the client stalls for 2 s
            await asyncio.sleep(0.1)
            peak = max(peak, _rss(proc.pid))
        assert not s.cluster.held, "decode finished while the client was stalled: the router buffered it"
        t0 = time.perf_counter()
        tail = b""
        try:
            async with asyncio.timeout(30):
                while chunk := await reader.read(65536):  # to the end: the router closes the connection
                    got += len(chunk)
                    tail = (tail + chunk)[-64:]
        except TimeoutError:
            raise AssertionError(
                f"stream stuck after {got} bytes (decode done: {bool(s.cluster.held)}): {tail!r}"
            ) from None
        assert b"data: [DONE]" in tail
        writer.close()
        assert s.cluster.held  # the answer did complete
        growth = (peak - base) / 2**20
        TALLY.notes.append(
            f"slow client: {got / 2**20:.1f} MB streamed; router RSS {base / 2**20:.1f} MB before, "
            f"peak {peak / 2**20:.1f} MB while the client stalled (+{growth:.1f} MB); "
            f"drained in {time.perf_counter() - t0:.1f} s"
        )
        assert got > 15 * 2**20
        assert growth < 8, growth
    finally:
        router.stop()
    survived(fault)


# ---------------------------------------------------------------- soak


async def test_soak_entries_bounded_rss_flat_no_failures(make_stack: StackFactory) -> None:
    conversations, turns_each, concurrency, max_entries, ttl, grace = 300, 10, 48, 32, 1.0, 0.5
    s = await make_stack(routers=0)
    cfg = RouterConfig(
        served_model_name="Qwen",
        generation="g1",
        prefill=tuple(s.prefill_urls),
        decode=tuple(s.decode_urls),
        kv_recompute_threshold=8,
        health_check_interval_seconds=60,
        max_entries=max_entries,
        conversation_ttl_seconds=ttl,
        tenancy=TenancyConfig(identity="single"),
    )
    router, serving, url = await start_router(cfg, store=MemoryStore(max_entries, grace=grace))
    s.servings.append(serving)
    fault = injected("soak")
    failures: list[Any] = []
    peak_entries = 0
    done = 0
    rss_start = 0

    async def one(http: aiohttp.ClientSession, i: int, sem: asyncio.Semaphore) -> None:
        nonlocal peak_entries, done
        async with sem:
            conv = Conversation(f"soak-{i}")
            for t in range(turns_each):
                if i % 10 == 0 and t == 5:
                    await asyncio.sleep(ttl + 0.05)  # past the deadline: expired
                status, _, data = await conv.turn(http, url, stream=(i + t) % 2 == 0, expect_ok=True)
                if status != 200:
                    failures.append((i, t, status, data))
                    return
                done += 1
                peak_entries = max(peak_entries, len(router.store._items))  # type: ignore[attr-defined]

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:
        warm = asyncio.Semaphore(concurrency)
        await asyncio.gather(*(one(http, -1 - i, warm) for i in range(20)))
        for eng in (*s.prefills, *s.decodes):
            eng.requests.clear()
        rss_start = _rss()
        sem = asyncio.Semaphore(concurrency)
        tasks = [asyncio.create_task(one(http, i, sem)) for i in range(conversations)]
        while not all(t.done() for t in tasks):
            await asyncio.sleep(0.5)
            for eng in (*s.prefills, *s.decodes):
                eng.requests.clear()  # the fakes' request log, not the router's memory
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
        rss_end = _rss()
        doc = await stats(http, url)
        await asyncio.sleep(ttl + grace + 0.1)
        after_deadline = (await stats(http, url))["entries"]
    reuse = doc["reuse"]
    TALLY.soak.update(
        turns=done,
        conversations=conversations,
        max_entries=max_entries,
        peak_entries=peak_entries,
        entries_end=doc["entries"],
        entries_after_deadline=after_deadline,
        rss_start_mb=round(rss_start / 2**20, 1),
        rss_end_mb=round(rss_end / 2**20, 1),
        seconds=round(elapsed, 1),
    )
    TALLY.notes.append("soak outcomes: " + ", ".join(f"{k}={v}" for k, v in reuse.items() if v))
    tally_reads(s.cluster)
    assert not failures, failures[:3]
    assert done == conversations * turns_each + 20 * turns_each
    assert peak_entries <= max_entries and doc["entries"] <= max_entries
    assert after_deadline == 0  # the deadline sweeps what LRU left
    assert reuse["hit"] > 2000
    # each first turn misses; a conversation that pauses past the deadline finds its entry
    # expired, or already gone to LRU (48 live conversations, 32 entries)
    assert reuse["miss"] + reuse["expired"] >= conversations + 20 + conversations // 10
    assert all(r.correct for r in s.cluster.reads)
    assert rss_end - rss_start < 64 * 2**20, (rss_start, rss_end)
    survived(fault)


class DownStore:
    """A store whose every call fails, like Redis with nothing listening."""

    async def take(self, key: str) -> Any:
        raise ConnectionError("store down")

    async def take_first(self, keys: Any) -> Any:
        raise ConnectionError("store down")

    async def put(self, key: str, entry: Any, head: str | None = None, length: int = 0) -> None:
        raise ConnectionError("store down")

    async def lengths(self, heads: Any) -> list[int]:
        raise ConnectionError("store down")

    async def count(self) -> int:
        raise ConnectionError("store down")

    async def holding(self, decode_url: str, generation: str) -> int:
        raise ConnectionError("store down")

    async def close(self) -> None:
        return None


async def test_a_store_that_fails_every_call_degrades_to_plain_pd(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(routers=0)
    cfg = RouterConfig(
        served_model_name="Qwen",
        generation="g1",
        prefill=tuple(s.prefill_urls),
        decode=tuple(s.decode_urls),
        tenancy=TenancyConfig(identity="single"),
        reuse_headers=True,
    )
    _, serving, url = await start_router(cfg, store=DownStore())
    s.servings.append(serving)
    conv = Conversation("down-1")
    for stream in (False, True, False):
        status, headers, _ = await conv.turn(http, url, stream=stream)
        assert status == 200 and headers["X-PDX-Reuse"] == "miss"
    assert (await stats(http, url))["entries"] == 0
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    for op, n in (("take", 3), ("put", 3)):
        assert f'pdx_router_store_errors_total{{op="{op}"}} {n}.0' in text, text
    assert 'pdx_router_store_errors_total{op="count"}' in text


async def test_a_stream_longer_than_the_timeout_is_not_cut_but_a_silent_one_is(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    """upstreamTimeoutSeconds bounds how long an engine is silent, not how long a stream is:
    a long, steady answer is whole; decode going quiet mid-stream ends it with an error event."""
    s = await make_stack(decode_opts={"token_delay": 0.15, "output_tokens": 12}, upstream_timeout_seconds=0.6)
    conv = Conversation("long-1")
    t0 = time.perf_counter()
    status, _, lines = await conv.turn(http, s.url, stream=True)
    assert status == 200 and lines[-1] == b"data: [DONE]", lines[-2:]
    assert time.perf_counter() - t0 > 1.5  # longer than the timeout, and whole
    assert (await stats(http, s.url))["entries"] == 1
    fault = injected("decode silent mid-stream")
    s.decode.opts.token_delay = 30.0  # the first token, then nothing
    body = {"model": "Qwen", "messages": conv.messages, "stream": True, "conversation_id": conv.cid}
    TALLY.turns += 1
    t0 = time.perf_counter()
    async with asyncio.timeout(10), http.post(s.url + CHAT, json=body) as r:
        assert r.status == 200
        raw = await r.read()
    elapsed = time.perf_counter() - t0
    events = [ln for ln in raw.split(b"\n") if ln.startswith(b"data: ")]
    assert b"data: [DONE]" not in events
    message = orjson.loads(events[-1][6:])["error"]["message"]
    assert "timed out" in message and "upstreamTimeoutSeconds" in message, message
    assert "http://" not in message, message
    TALLY.expected_errors += 1
    assert 0.5 < elapsed < 1.5, elapsed
    assert (await stats(http, s.url))["entries"] == 0
    await until(lambda: s.decode.cancelled == 1, what="decode to see the request aborted")
    s.decode.opts.token_delay = 0.0
    status, _, _ = await conv.turn(http, s.url)
    assert status == 200
    survived(fault)
