"""What a client must not be able to do through the router."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from .conftest import StackFactory
from .helpers import EVIL, LONG, chat, user


async def test_client_kv_transfer_params_are_dropped_on_every_hop(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack()
    for conversation in (None, "c1"):
        status, _, _ = await chat(http, s.url, [user(LONG)], conversation=conversation, kv_transfer_params=EVIL)
        assert status == 200
    for _, body in s.prefill.requests + s.decode.requests:
        kv = body.get("kv_transfer_params") or {}
        assert kv.get("remote_host") != "169.254.169.254"
        assert kv.get("remote_request_id") != "someone-elses"
    assert s.cluster.reads == []


async def test_oversized_request_gets_413(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack(max_request_bytes=1024)
    status, _, _ = await chat(http, s.url, [user("x" * 4096)])
    assert status == 413
    assert s.prefill.requests == []


async def test_bad_json_gets_400(make_stack: StackFactory, http: aiohttp.ClientSession) -> None:
    s = await make_stack()
    async with http.post(s.url + "/v1/chat/completions", data=b"{nope") as r:
        assert r.status == 400


async def test_client_disconnect_cancels_decode(make_stack: StackFactory) -> None:
    s = await make_stack(decode_opts={"token_delay": 0.2, "output_tokens": 50})
    body = {"model": "Qwen", "messages": [user(LONG)], "stream": True}
    async with aiohttp.ClientSession() as session:
        resp = await session.post(s.url + "/v1/chat/completions", json=body)
        await resp.content.readline()
        resp.close()
    for _ in range(40):
        if s.decode.cancelled:
            break
        await asyncio.sleep(0.05)
    assert s.decode.cancelled == 1


async def test_client_disconnect_during_prefill_cancels_prefill(make_stack: StackFactory) -> None:
    s = await make_stack(prefill_opts={"prefill_delay": 5})
    body = {"model": "Qwen", "messages": [user(LONG)]}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as session:
        with contextlib.suppress(TimeoutError):
            await session.post(s.url + "/v1/chat/completions", json=body)
    for _ in range(40):
        if s.prefill.cancelled:
            break
        await asyncio.sleep(0.05)
    assert s.prefill.cancelled == 1
    assert s.decode.requests == []
