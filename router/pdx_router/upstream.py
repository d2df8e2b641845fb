"""The engine hops: prefill's and /tokenize's answers read whole, decode's as it comes, over
`wire` (the router's own HTTP/1.1 client); health and metrics checks over one aiohttp session.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Final

import aiohttp
import orjson
from pydantic import ValidationError

from pdx_contract import load

from .endpoints import Endpoint
from .errors import ClientFacingError, MalformedAnswer, TooBig, UpstreamError, WireError
from .filters import MAX_ANSWER_BYTES, token_ids
from .ids import IdText, of_json_beside, of_list
from .wire import Call, Collect, Head, Sink, Wire


class Upstream:
    """The engines' HTTP client. The completion hops go over `wire` (keep-alive, no task
    switch per chunk); the health and metrics checks over one aiohttp session."""

    def __init__(self, timeout_seconds: float) -> None:
        self.timeout_seconds = timeout_seconds
        self.wire = Wire(connect_timeout=5.0)
        self.max_answer_bytes = MAX_ANSWER_BYTES
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self.wire.idle_seconds, ttl_dns_cache=10)
        timeout = aiohttp.ClientTimeout(total=self.timeout_seconds, sock_connect=5)
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout)

    async def close(self) -> None:
        await self.wire.close()
        if self.session is not None:
            await self.session.close()

    async def post_json(self, ep: Endpoint, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """POST and return the JSON answer within the timeout; 4xx -> ClientFacingError, a
        malformed answer -> MalformedAnswer (with its status), else UpstreamError."""
        head, raw = await self.post(ep, path, orjson.dumps(body), headers, total=True)
        return json_object(ep, head.status, raw)

    async def post(
        self, ep: Endpoint, path: str, body: bytes, headers: dict[str, str], total: bool
    ) -> tuple[Head, bytes]:
        """POST and read the whole answer (at most max_answer_bytes) of status < 400. `total`:
        the timeout bounds the whole call (prefill, /tokenize); else the silence between
        bytes (a JSON decode answer may take longer to generate than the timeout)."""
        sink = Collect(self.max_answer_bytes)
        try:
            async with asyncio.timeout(self.timeout_seconds if total else None):
                sink.call = await self.wire.send(
                    ep.url, path, body, headers, sink, silence=None if total else self.timeout_seconds
                )
                raw = await sink.done
        except TooBig as exc:
            raise MalformedAnswer(ep, sink.head_.status if sink.head_ else 200, str(exc)) from None
        except (WireError, TimeoutError) as exc:
            raise UpstreamError(ep, None, repr(exc), exc) from exc
        finally:
            sink.abort()  # timed out or cancelled, the engine aborts the request (a no-op once answered)
        head = sink.head_
        assert head is not None
        check_status(ep, head, raw)
        return head, raw

    async def stream(self, ep: Endpoint, path: str, body: dict[str, Any], headers: dict[str, str], sink: Sink) -> Call:
        """Start a request whose answer goes to `sink` as it comes (the decode hop); the
        timeout bounds silence, not the answer's length."""
        try:
            return await self.wire.send(ep.url, path, orjson.dumps(body), headers, sink, silence=self.timeout_seconds)
        except WireError as exc:
            raise UpstreamError(ep, None, repr(exc), exc) from exc

    def _s(self) -> aiohttp.ClientSession:
        assert self.session is not None, "Upstream.start() was not called"
        return self.session

    async def get(self, url: str, timeout: float) -> tuple[int, bytes]:
        async with self._s().get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            return resp.status, await resp.read()


def check_status(ep: Endpoint, head: Head, raw: bytes) -> None:
    """5xx -> UpstreamError (may be retried), 4xx -> ClientFacingError (the client's fault)."""
    if head.status >= 500:
        raise UpstreamError(ep, head.status, raw[:300].decode(errors="replace"))
    if head.status >= 400:
        raise ClientFacingError(head.status, raw, head.content_type)


_TOKENS: Final = b'"tokens":['


def tokenized_ids(raw: bytes, known: IdText) -> IdText | None:
    """The ids of a /tokenize answer (`{"count":..,"tokens":[..],..}`), or None if it has
    none. vLLM's compact array is taken as text, checked beside `known` (ids.of_json_beside),
    and the rest of the answer must be a JSON object; any other form is parsed."""
    i = raw.find(_TOKENS)
    end = raw.find(b"]", i + 9) if i > 0 else -1
    if end > 0 and raw[i - 1] in (0x7B, 0x2C) and raw.find(_TOKENS, end) < 0:
        try:
            rest = orjson.loads(raw[: i + 9] + b"[]" + raw[end + 1 :])
        except orjson.JSONDecodeError:
            return None
        return of_json_beside(raw[i + 9 : end + 1], known) if isinstance(rest, dict) else None
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    tokens = token_ids(answer.get("tokens")) if isinstance(answer, dict) else None
    try:
        return of_list(tokens) if tokens is not None else None
    except ValueError:
        return None


def json_object(ep: Endpoint, status: int, raw: bytes) -> dict[str, Any]:
    """An engine's answer as a JSON object, or MalformedAnswer."""
    try:
        out = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise MalformedAnswer(ep, status, "answer is not JSON") from None
    if not isinstance(out, dict):
        raise MalformedAnswer(ep, status, "answer is not a JSON object")
    return out


_BLOCK_SIZE_RE: Final = re.compile(rb'vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"')


_LOAD_RE: Final = re.compile(rb"^vllm:num_requests_(?:running|waiting)(?:\{[^}\n]*\})? ([0-9.eE+-]+)$", re.M)


def load_from_metrics(text: bytes) -> int | None:
    """Running plus waiting requests, over every engine the text exports (data parallel);
    None when it exports neither."""
    found = _LOAD_RE.findall(text)
    if not found:
        return None
    try:
        return round(sum(float(v) for v in found))
    except ValueError:
        return None


def read_load(raw: bytes) -> int | None:
    """The requests in a `pdx_contract.load` answer; None for anything else (a vLLM without
    the route answers 404, or 501 where it cannot count)."""
    try:
        return load.LoadAnswer.model_validate_json(raw).requests
    except ValidationError:
        return None


def block_size_from_metrics(text: bytes) -> int | None:
    """vLLM exports its cache config as labels of vllm:cache_config_info."""
    m = _BLOCK_SIZE_RE.search(text)
    return int(m.group(1)) if m else None
