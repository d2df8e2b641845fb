"""Talking to engines: one shared keep-alive session, and cheap surgery on stream chunks.

Stream chunks are passed through as bytes. Only the fields the router itself asked for are
cut out, by byte search (a structural `"token_ids":[` cannot occur inside a JSON string, where
quotes are escaped), and only a chunk carrying kv_transfer_params is parsed and re-encoded.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import orjson

from .endpoints import Endpoint
from .entries import Captured

_JSON = {"Content-Type": "application/json"}
_KV_MARK = b'"kv_transfer_params":'
_ID_FIELDS = (b'"prompt_token_ids":', b'"token_ids":')
_ANY_ID = b'token_ids":'  # a suffix of both id fields: one search rules both out


class UpstreamError(Exception):
    """An engine could not be reached or answered 5xx: the turn may be retried."""

    def __init__(self, endpoint: Endpoint, status: int | None, detail: str) -> None:
        super().__init__(f"{endpoint.role} {endpoint.url}: {status or 'connection'}: {detail}")
        self.endpoint = endpoint
        self.status = status  # None: the engine could not be reached (or its answer was cut)


class ClientFacingError(Exception):
    """An engine rejected the request itself (4xx): pass its answer to the client."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(f"engine answered {status}")
        self.status = status
        self.body = body
        self.content_type = content_type


def _cut_field(data: bytes, name: bytes) -> tuple[bytes, list[list[int]]]:
    """Remove every `name: [ints]` / `name: null` member from a JSON object in bytes."""
    found: list[list[int]] = []
    start = 0
    while True:
        i = data.find(name, start)
        if i < 0:
            return data, found
        j = i + len(name)
        if data.startswith(b"null", j):
            end = j + 4
        elif data.startswith(b"[", j):
            end = data.find(b"]", j) + 1
            if end <= 0:
                return data, found
            found.append(orjson.loads(data[j:end]))
        else:
            start = j
            continue
        if data[i - 1 : i] == b",":
            data = data[: i - 1] + data[end:]
            start = i - 1
        elif data[end : end + 1] == b",":
            data = data[:i] + data[end + 1 :]
            start = i
        else:
            data = data[:i] + data[end:]
            start = i


class StreamFilter:
    """Rewrites decode's SSE lines for the client and captures token ids and kv params."""

    def __init__(self, capture: bool, strip_ids: bool) -> None:
        self.capture = capture
        self.strip_ids = strip_ids
        self.captured = Captured(output_ids=[] if capture else None)
        self._tail = b""

    def feed(self, data: bytes) -> bytes:
        """Filter whatever block the socket delivered, so the relay writes once per block
        rather than once per SSE line; an unterminated last line waits for the next block."""
        if self._tail:
            data = self._tail + data
        end = data.rfind(b"\n") + 1
        self._tail = data[end:]
        data = data[:end]
        if _KV_MARK not in data and (_ANY_ID not in data or not (self.capture or self.strip_ids)):
            return data
        return b"".join([self.line(x) for x in data.splitlines(keepends=True)])

    def flush(self) -> bytes:
        """The stream ended: filter an unterminated last line, or drop it if it is cut short
        JSON (then the turn is incomplete and must not be stored)."""
        tail, self._tail = self._tail, b""
        if not tail:
            return b""
        try:
            return self.line(tail)
        except orjson.JSONDecodeError:
            self.captured.kv = None
            return b""

    def line(self, line: bytes) -> bytes:
        if not line.startswith(b"data: {"):
            return line
        cap = self.captured
        if self.capture or self.strip_ids:
            for name in _ID_FIELDS:
                if name in line:
                    if self.strip_ids:
                        line, found = _cut_field(line, name)
                    else:
                        found = [orjson.loads(m.group(1)) for m in _id_re(name).finditer(line)]
                    if self.capture and found:
                        if name == b'"prompt_token_ids":':
                            cap.prompt_ids = found[0]
                        else:
                            cap.choices = max(cap.choices, len(found))
                            if cap.output_ids is not None:
                                cap.output_ids.extend(found[0])
        if _KV_MARK in line:
            chunk = orjson.loads(line[6:])
            kv = chunk.pop("kv_transfer_params", None)
            if isinstance(kv, dict):
                cap.kv = kv
            line = b"data: " + orjson.dumps(chunk) + (b"\n" if line.endswith(b"\n") else b"")
        return line


_ID_RES: dict[bytes, re.Pattern[bytes]] = {}


def _id_re(name: bytes) -> re.Pattern[bytes]:
    pat = _ID_RES.get(name)
    if pat is None:
        pat = _ID_RES[name] = re.compile(re.escape(name) + rb"(\[[0-9,\s]*\])")
    return pat


def filter_response(data: dict[str, Any], capture: bool, strip_ids: bool) -> Captured:
    """Non-streamed decode answer: capture, then strip internals in place."""
    cap = Captured()
    kv = data.pop("kv_transfer_params", None)
    cap.kv = kv if isinstance(kv, dict) else None
    choices = data.get("choices") or []
    cap.choices = len(choices)
    prompt = data.get("prompt_token_ids")
    if capture and choices:
        first = choices[0]
        prompt = prompt if prompt is not None else first.get("prompt_token_ids")
        cap.prompt_ids = prompt
        cap.output_ids = first.get("token_ids")
    if strip_ids:
        data.pop("prompt_token_ids", None)
        for c in choices:
            if isinstance(c, dict):
                c.pop("prompt_token_ids", None)
                c.pop("token_ids", None)
    return cap


class Upstream:
    """The engines' HTTP client: one session, keep-alive, no per-request connection setup."""

    def __init__(self, timeout_seconds: float) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds, sock_connect=5)
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=10)
        self.session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, json_serialize=_dumps_str)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    def _s(self) -> aiohttp.ClientSession:
        assert self.session is not None, "Upstream.start() was not called"
        return self.session

    async def post_json(self, ep: Endpoint, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """POST and return the JSON answer; 4xx -> ClientFacingError, else UpstreamError."""
        try:
            async with self._s().post(ep.url + path, data=orjson.dumps(body), headers={**headers, **_JSON}) as resp:
                raw = await resp.read()
                if resp.status >= 500:
                    raise UpstreamError(ep, resp.status, raw[:300].decode(errors="replace"))
                if resp.status >= 400:
                    raise ClientFacingError(resp.status, raw, resp.content_type)
                out = orjson.loads(raw)
                if not isinstance(out, dict):
                    raise UpstreamError(ep, resp.status, "answer is not a JSON object")
                return out
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            raise UpstreamError(ep, None, repr(exc)) from exc

    def open(self, ep: Endpoint, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        """Start a request whose answer is read incrementally (the decode hop)."""
        return self._s().post(ep.url + path, data=orjson.dumps(body), headers={**headers, **_JSON})

    async def get(self, url: str, timeout: float) -> tuple[int, bytes]:
        async with self._s().get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            return resp.status, await resp.read()


def _dumps_str(obj: Any) -> str:
    return orjson.dumps(obj).decode()


_BLOCK_SIZE_RE = re.compile(rb'vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"')


def block_size_from_metrics(text: bytes) -> int | None:
    """vLLM exports its cache config as labels of vllm:cache_config_info."""
    m = _BLOCK_SIZE_RE.search(text)
    return int(m.group(1)) if m else None
