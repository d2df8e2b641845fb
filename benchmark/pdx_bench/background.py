"""Background streams: long answers decoding through the router while a leg's turns run.

A prefill on decode (a decode-local turn) runs in decode's batch and delays the next token of
every stream decode is generating; these streams measure that delay. Each is a single-turn
request: no conversation id and no history, so the router sends it through prefill as plain
P/D and it is never a decode-local candidate itself. Its answer has a fixed length
(`max_tokens` = `min_tokens`), it is restarted as it ends, and every content chunk's arrival
is recorded on the client's clock (`time.perf_counter`, as `RequestRecord.start_time_ms`),
so TPOT can be read over any window of the leg, such as a point's follow-up turns.

The streams run on a thread of their own with its own event loop: reading a few hundred
chunks a second must not delay the measured client's first tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from pdx_contract import headers as hdr

from .client import request_body, sse_chunks
from .records import read_bytes
from .workload import TokenCounter, filler


@dataclass(frozen=True)
class BackgroundSpec:
    """How many streams, and the size of each request's prompt and answer, in tokens."""

    streams: int
    prompt_tokens: int = 128
    output_tokens: int = 512

    def __post_init__(self) -> None:
        if self.streams < 1 or self.prompt_tokens < 1 or self.output_tokens < 2:
            raise ValueError("background streams need streams >= 1, prompt tokens >= 1 and output tokens >= 2")


@dataclass
class StreamRecord:
    """One request of one background stream; `chunk_times_ms` is when each content chunk arrived."""

    stream: int
    request: int
    leg: str
    start_time_ms: float
    chunk_times_ms: list[float] = field(default_factory=list)
    output_num_tokens: int | None = None  # the engine's usage.completion_tokens
    reuse: str | None = None  # X-PDX-Reuse: what the router did with it
    http_status: int = 0
    error: str | None = None
    complete: bool = False  # False: cut when the leg ended (or failed)

    @property
    def tokens_per_chunk(self) -> float:
        """vLLM streams a token a chunk; a server that packs several is read per token all the same."""
        if self.complete and self.output_num_tokens and self.chunk_times_ms:
            return max(1.0, self.output_num_tokens / len(self.chunk_times_ms))
        return 1.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["chunk_times_ms"] = [round(t, 3) for t in self.chunk_times_ms]
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> StreamRecord:
        return cls(**obj)


def window_tpots(
    records: Sequence[StreamRecord], windows: Sequence[tuple[float, float]], min_gaps: int = 4
) -> tuple[list[float], list[float]]:
    """TPOT and inter-token gaps of the streams during the windows (start, end in ms).

    For each window and each stream request that decoded in it: the mean gap between its
    chunks that arrived inside the window (the gap that ended there, so a stall that began
    just before counts), per token; one TPOT each, if it had at least `min_gaps` such gaps.
    Returns those TPOTs and every gap, per token, that ended inside a window.
    """
    tpots: list[float] = []
    gaps: list[float] = []
    for start, end in windows:
        for rec in records:
            times = rec.chunk_times_ms
            inside = [times[i] - times[i - 1] for i in range(1, len(times)) if start <= times[i] <= end]
            per_token = [g / rec.tokens_per_chunk for g in inside]
            gaps += per_token
            if len(per_token) >= min_gaps:
                tpots.append(sum(per_token) / len(per_token))
    return tpots, gaps


def write_streams(path: Path, records: Sequence[StreamRecord]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps([r.to_json() for r in records]) + b"\n")
    return path


def read_streams(path: Path) -> list[StreamRecord]:
    return [StreamRecord.from_json(o) for o in orjson.loads(read_bytes(path))]


def _now_ms() -> float:
    return time.perf_counter_ns() / 1e6


class BackgroundStreams:
    """`streams` requests in flight through the router from `start()` until `stop()`."""

    def __init__(
        self,
        url: str,
        model: str,
        spec: BackgroundSpec,
        counter: TokenCounter,
        *,
        leg: str,
        label: str,
        timeout_s: float = 300.0,
    ) -> None:
        self.url = url.rstrip("/") + "/v1/chat/completions"
        self.model = model
        self.spec = spec
        self.counter = counter
        self.leg = leg
        self.label = label
        self.timeout_s = timeout_s
        self.records: list[StreamRecord] = []  # appended on the streams' thread; read after stop()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._looping = threading.Event()
        self._decoding: set[int] = set()
        self._all_decoding = threading.Event()

    def start(self, wait_s: float | None = None) -> bool:
        """Start the streams; True once every one has its first token (before `wait_s`, default the timeout)."""
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), name="pdx-background", daemon=True)
        self._thread.start()
        self._looping.wait(30)
        return self._all_decoding.wait(self.timeout_s if wait_s is None else wait_s)

    def stop(self) -> list[StreamRecord]:
        """Cut the streams (their requests so far stay recorded) and return every request."""
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(60)
        return self.records

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._looping.set()
        async with aiohttp.ClientSession() as session:
            tasks = [asyncio.create_task(self._stream(session, i)) for i in range(self.spec.streams)]
            await self._stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _body(self, stream: int, request: int) -> dict[str, Any]:
        lead = f"Background stream {stream}, request {request} of {self.label}. Write at length about:"
        prompt = filler(f"{self.label}:{stream}:{request}", self.spec.prompt_tokens, self.counter, lead)
        n = self.spec.output_tokens
        return request_body(self.model, [{"role": "user", "content": prompt}], None, max_tokens=n, min_tokens=n)

    async def _stream(self, session: aiohttp.ClientSession, stream: int) -> None:
        request = 0
        while True:
            rec = StreamRecord(stream=stream, request=request, leg=self.leg, start_time_ms=_now_ms())
            self.records.append(rec)
            await self._one(session, rec, self._body(stream, request))
            if rec.error is not None:
                await asyncio.sleep(1.0)  # a router that refuses must not be hammered
            request += 1

    async def _one(self, session: aiohttp.ClientSession, rec: StreamRecord, body: dict[str, Any]) -> None:
        try:
            async with session.post(
                self.url,
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as resp:
                rec.http_status = resp.status
                rec.reuse = resp.headers.get(hdr.REUSE)
                if resp.status != 200:
                    rec.error = (await resp.text())[:500]
                    return
                async for chunk in sse_chunks(resp):
                    self._absorb(rec, chunk)
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            rec.error = repr(exc)
            return
        rec.complete = rec.error is None

    def _absorb(self, rec: StreamRecord, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            rec.error = str(chunk["error"])[:500]
            return
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            rec.output_num_tokens = usage.get("completion_tokens")
        if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
            rec.chunk_times_ms.append(_now_ms())
            if rec.stream not in self._decoding:
                self._decoding.add(rec.stream)
                if len(self._decoding) == self.spec.streams:
                    self._all_decoding.set()
