"""Small client helpers shared by the router tests."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson


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
