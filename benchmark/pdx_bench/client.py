"""The load generator: streams OpenAI chat completions through the router, turn by turn.

Timing follows vLLM's multi-turn benchmark so the numbers compare: TTFT is the time to the
first chunk with content (adjusted when that chunk holds several tokens), TPOT the decode
time per token after it, latency the time to the end of the stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from pdx_contract import headers as hdr

from .enginemetrics import EngineScraper, Snapshot, accumulate, snapshot_delta, xfer_totals
from .records import RequestRecord, path_of
from .workload import Conversation, TokenCounter, WordCounter, Workload


@dataclass
class Reply:
    """What one streamed request returned, raw (before token-based adjustments)."""

    status: int
    content: str = ""
    first_chunk: str = ""
    ttft_ms: float = -1.0
    second_chunk: str = ""
    second_ms: float = -1.0  # to the second chunk with content: where the steady decode starts
    latency_ms: float = -1.0
    start_time_ms: float = 0.0
    content_chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prefill_ms: float | None = None
    router_ms: float | None = None
    reuse: str | None = None
    reused_tokens: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.ttft_ms >= 0


def request_body(
    model: str,
    messages: Sequence[Mapping[str, str]],
    conversation_id: str | None,
    max_tokens: int,
    min_tokens: int | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": list(messages),
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    if min_tokens is not None:
        body["min_tokens"] = min_tokens
    if conversation_id is not None:
        body["conversation_id"] = conversation_id
    return body


async def sse_chunks(resp: aiohttp.ClientResponse) -> AsyncIterator[Any]:
    """The JSON of each `data:` event of a streamed answer, up to `[DONE]`."""
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        yield orjson.loads(payload)


def _float(v: str | None) -> float | None:
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


async def chat(
    session: aiohttp.ClientSession,
    base_url: str,
    body: dict[str, Any],
    conversation_id: str | None = None,
    timeout_s: float = 300.0,
) -> Reply:
    """One streamed chat completion; never raises for HTTP or transport errors."""
    headers = {"Content-Type": "application/json"}
    if conversation_id is not None:
        headers["X-Session-ID"] = conversation_id
    url = base_url.rstrip("/") + "/v1/chat/completions"
    start = time.perf_counter_ns()
    reply = Reply(status=0, start_time_ms=start / 1e6)
    try:
        async with session.post(
            url, data=orjson.dumps(body), headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            reply.status = resp.status
            reply.prefill_ms = _float(resp.headers.get(hdr.PREFILL_MS))
            reply.router_ms = _float(resp.headers.get(hdr.ROUTER_MS))
            reply.reuse = resp.headers.get(hdr.REUSE)
            reply.reused_tokens = int(_float(resp.headers.get(hdr.REUSED_TOKENS)) or 0)
            if resp.status != 200:
                reply.error = (await resp.text())[:500]
                return reply
            async for chunk in sse_chunks(resp):
                _absorb(reply, chunk, start)
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
        reply.error = repr(exc)
        return reply
    reply.latency_ms = (time.perf_counter_ns() - start) / 1e6
    if reply.ttft_ms < 0 and reply.error is None:
        reply.error = "stream ended without content"
    return reply


def _absorb(reply: Reply, chunk: dict[str, Any], start_ns: int) -> None:
    if "error" in chunk:
        reply.error = str(chunk["error"])[:500]
        return
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        reply.prompt_tokens = usage.get("prompt_tokens")
        reply.completion_tokens = usage.get("completion_tokens")
    for choice in chunk.get("choices") or []:
        text = (choice.get("delta") or {}).get("content")
        if not text:
            continue
        if reply.ttft_ms < 0:
            reply.ttft_ms = (time.perf_counter_ns() - start_ns) / 1e6
            reply.first_chunk = text
        else:
            if reply.content_chunks == 0:
                reply.second_ms = (time.perf_counter_ns() - start_ns) / 1e6
                reply.second_chunk = text
            reply.content_chunks += 1
        reply.content += text


def to_record(
    reply: Reply,
    *,
    conversation: Conversation,
    turn: int,
    messages: Sequence[Mapping[str, str]],
    client_id: int,
    counter: TokenCounter,
    leg: str = "",
) -> RequestRecord:
    """Derive vLLM's per-request stats from a reply.

    Token counts come from the engine's usage; a server that sends none gets vLLM's own
    approximation instead (message contents counted by the workload's counter).
    """
    out_tokens = reply.completion_tokens if reply.completion_tokens is not None else counter.count(reply.content)
    if reply.prompt_tokens is not None:
        in_tokens = reply.prompt_tokens
    else:
        in_tokens = sum(counter.count(m["content"]) for m in messages)
    first_tokens = max(1, counter.count(reply.first_chunk)) if reply.first_chunk else 0
    ttft = reply.ttft_ms
    tpot = 0.0
    if out_tokens > 1 and out_tokens > first_tokens:
        tpot = (reply.latency_ms - reply.ttft_ms) / (out_tokens - first_tokens)
    if first_tokens > 1:
        ttft = max(0.1, ttft - (first_tokens - 1) * tpot)
    steady = None
    if reply.second_ms >= 0:
        rest = out_tokens - first_tokens - max(1, counter.count(reply.second_chunk))
        steady = (reply.latency_ms - reply.second_ms) / rest if rest > 0 else None
    question = conversation.turns[turn - 1].tokens
    cached = 100.0 * max(0, in_tokens - question) / in_tokens if in_tokens > 0 else 0.0
    return RequestRecord(
        ttft_ms=ttft,
        tpot_ms=tpot,
        steady_tpot_ms=steady,
        latency_ms=reply.latency_ms,
        start_time_ms=reply.start_time_ms,
        input_num_turns=len(messages),
        input_num_tokens=in_tokens,
        output_num_tokens=out_tokens,
        output_num_chunks=reply.content_chunks,
        output_num_first_chunk_tokens=first_tokens,
        approx_cached_percent=cached,
        conversation_id=conversation.conversation_id,
        client_id=client_id,
        turn=turn,
        leg=leg,
        prefix_tokens=0,
        suffix_tokens=conversation.turns[turn - 1].new_tokens,
        prefill_ms=reply.prefill_ms,
        router_ms=reply.router_ms,
        reuse=reply.reuse,
        reused_tokens=reply.reused_tokens,
        http_status=reply.status,
    )


@dataclass
class RunResult:
    """Records of answered requests, and what failed (kept out of the records, as vLLM does)."""

    records: list[RequestRecord] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    # With one client and a scraper: what the engines counted around follow-up turns (turn >= 2)
    followups: Snapshot | None = None
    # the same per path: "local" (X-PDX-Reuse local: prefilled on decode), "prefill" (the others)
    followups_by_path: dict[str, Snapshot] = field(default_factory=dict)
    # ...and around first turns (turn 1): ON's first-turn overhead, engine by engine (firstturn.py)
    first_turns: Snapshot | None = None


class _Pacer:
    """Spaces request starts by the workload's Poisson gaps, shared by all clients."""

    def __init__(self, gaps: list[float]) -> None:
        self._gaps = gaps
        self._i = 0
        self._next = time.monotonic()
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        if not self._gaps:
            return
        async with self._lock:
            delay = self._next - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self._next = max(self._next, time.monotonic()) + self._gaps[self._i % len(self._gaps)]
            self._i += 1


async def run(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    workload: Workload,
    *,
    counter: TokenCounter | None = None,
    scraper: EngineScraper | None = None,
    leg: str = "",
    send_conversation_id: bool = True,
    transfer_role: str | None = "prefill",
    on_done: Callable[[RequestRecord | None], None] | None = None,
    timeout_s: float = 300.0,
) -> RunResult:
    """Run every conversation of the workload; `concurrency` clients take them in order.

    With one client and a scraper, every engine's metrics are read around each request:
    each record gets its own transfer time from `transfer_role`'s NIXL histograms (prefill's
    D->P reads; None leaves the records' transfer fields unset), and the differences around
    follow-up turns are summed into `followups`, those around first turns into
    `first_turns`. Otherwise the caller spreads a group total over the hits
    (records.spread_group_transfer).
    """
    counter = counter or WordCounter()
    spec = workload.spec
    result = RunResult()
    queue: asyncio.Queue[Conversation] = asyncio.Queue()
    for conv in workload.conversations:
        queue.put_nowait(conv)
    pacer = _Pacer(workload.arrival_gaps())
    per_request = scraper is not None and scraper.enabled and spec.concurrency == 1

    async def client(client_id: int) -> None:
        if spec.stagger_s > 0:
            await asyncio.sleep(client_id * spec.stagger_s)
        while not queue.empty():
            conv = queue.get_nowait()
            answers: list[str] = []
            for turn in range(1, len(conv.turns) + 1):
                if turn > 1 and spec.think_time_s > 0:
                    await asyncio.sleep(spec.think_time_s)
                messages = conv.messages_for(turn, answers)
                cid = conv.conversation_id if send_conversation_id else None
                body = request_body(model, messages, cid, conv.max_tokens, conv.min_tokens)
                await pacer.wait()
                before = await scraper.snapshot() if per_request and scraper else None
                reply = await chat(session, base_url, body, cid, timeout_s)
                if not reply.ok:
                    result.errors.append(
                        {
                            "conversation_id": conv.conversation_id,
                            "turn": turn,
                            "status": reply.status,
                            "error": reply.error,
                        }
                    )
                    if on_done:
                        on_done(None)
                    # A conversation cannot continue without its answer: skip its remaining turns.
                    for _ in range(turn, len(conv.turns)):
                        if on_done:
                            on_done(None)
                    break
                rec = to_record(
                    reply,
                    conversation=conv,
                    turn=turn,
                    messages=messages,
                    client_id=client_id,
                    counter=counter,
                    leg=leg,
                )
                rec.prefix_tokens = spec.prefix_tokens
                if before is not None and scraper is not None:
                    window = snapshot_delta(await scraper.snapshot(), before)
                    if turn > 1:
                        result.followups = accumulate(result.followups, window)
                        path = path_of(reply.reuse)
                        result.followups_by_path[path] = accumulate(result.followups_by_path.get(path), window)
                    else:
                        result.first_turns = accumulate(result.first_turns, window)
                    hists = window.get(transfer_role) if transfer_role else None
                    if hists is not None:
                        xfer = xfer_totals(hists)
                        rec.kv_transfer_ms = xfer.seconds * 1000
                        rec.kv_transfer_bytes = xfer.bytes
                        rec.kv_transfer_source = "request"
                result.records.append(rec)
                answers.append(reply.content)
                if on_done:
                    on_done(rec)

    await asyncio.gather(*(client(i) for i in range(min(spec.concurrency, len(workload.conversations)))))
    result.records.sort(key=lambda r: r.start_time_ms)
    return result
