"""Small client helpers shared by the router tests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson

from pdx_router.app import Router
from pdx_router.endpoints import Endpoint, Role
from pdx_router.entries import Entry
from pdx_router.ids import of_list
from pdx_router.policy import shapes


async def chat(
    http: aiohttp.ClientSession,
    url: str,
    messages: list[dict[str, Any]],
    conversation: str | None = "c1",
    stream: bool = False,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> tuple[int, dict[str, str], Any]:
    """POST a chat turn; returns status, headers and the JSON answer (or the SSE lines)."""
    body: dict[str, Any] = {"model": "Qwen", "messages": messages, "stream": stream, **extra}
    if conversation is not None:
        body["conversation_id"] = conversation
    async with http.post(url + "/v1/chat/completions", json=body, headers=headers or {}) as r:
        raw = await r.read()
        if stream and r.status == 200:
            lines = [ln for ln in raw.split(b"\n") if ln.startswith(b"data: ")]
            return r.status, dict(r.headers), lines
        try:
            return r.status, dict(r.headers), orjson.loads(raw)
        except orjson.JSONDecodeError:
            return r.status, dict(r.headers), raw


def stream_text(lines: list[bytes]) -> str:
    out = ""
    for ln in lines:
        if ln == b"data: [DONE]":
            continue
        for c in orjson.loads(ln[6:])["choices"]:
            out += (c.get("delta") or {}).get("content") or c.get("text") or ""
    return out


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


LONG = " ".join(f"word{i}" for i in range(80))


def ep(role: Role, url: str, gen: str = "g1", healthy: bool = True, load: int = 0) -> Endpoint:
    """An engine as discovery would list it."""
    return Endpoint(url=url, role=role, generation=gen, healthy=healthy, outstanding=load)


def entry(tokens: list[int], blocks: int, block_size: int | None = 4, deadline: float = 100.0) -> Entry:
    """A stored entry: decode holds `tokens` in `blocks` blocks of one KV cache group."""
    kv = {
        "do_remote_prefill": False,
        "do_remote_decode": True,
        "remote_block_ids": [list(range(10, 10 + blocks))],
        "remote_engine_id": "decode-0",
        "remote_request_id": "r",
        "remote_host": "10.0.0.2",
        "remote_port": 5700,
        "remote_num_tokens": len(tokens),
        "remote_blocks_expiry_time": 9.0,
    }
    return Entry(kv, of_list(tokens), "http://d0", "g1", 0.0, deadline, block_size)


# kv_transfer_params a client might send to steer prefill's read elsewhere (always stripped).
EVIL = {
    "do_remote_decode": True,
    "do_remote_prefill": True,
    "remote_engine_id": "decode-0",
    "remote_block_ids": [[1, 2, 3]],
    "remote_host": "169.254.169.254",
    "remote_port": 80,
    "remote_request_id": "someone-elses",
    "remote_num_tokens": 48,
}


def key_of(router: Router, conversation: str, headers: Mapping[str, str] | None = None, **body: Any) -> str:
    """The store key the router gives a chat turn of this conversation (its tenancy and the
    turn's KV scope included), from the router's own request handling."""
    req = shapes.client_request(
        {"model": "Qwen", "messages": [], **body, "conversation_id": conversation},
        headers or {},
        "/v1/chat/completions",
        True,
        router.front,
    )
    assert req.key is not None, "this turn has no identity or no KV scope: nothing is stored"
    return req.key
