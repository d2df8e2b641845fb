"""Scale-down of decode without the TTFT cliff: a draining decode takes no turn, its KV is still
read, and its conversations move to another decode on their next turn (issue 18)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from pdx_contract.endpoints import PublishedEndpoint
from pdx_engine import drain

from .conftest import Stack, StackFactory
from .helpers import LONG, assistant, chat, user

CONVERSATIONS = 8


def _publish(s: Stack, decodes: dict[str, bool]) -> None:
    """The endpoints file as the operator writes it: every prefill, and these decodes (url ->
    draining); a decode left out is gone."""
    found = [PublishedEndpoint(role="prefill", url=u, generation="g1") for u in s.prefill_urls]
    found += [PublishedEndpoint(role="decode", url=u, generation="g1", draining=d) for u, d in decodes.items()]
    s.router.pool.update("static", found)


async def _turn(http: aiohttp.ClientSession, s: Stack, history: dict[str, list[dict[str, Any]]], c: str) -> str:
    status, h, data = await chat(http, s.url, history[c], conversation=c)
    assert status == 200
    history[c] += [assistant(data["choices"][0]["message"]["content"]), user(f"more {c}")]
    return h["X-PDX-Reuse"]


async def _lost_reuse_scaling_2_to_1(make_stack: StackFactory, drain: bool) -> tuple[int, list[Any]]:
    """Conversations on two decodes; decode-1 goes (through draining or at once); how many of
    the following turns recompute their history instead of reading it."""
    s = await make_stack(n_decode=2)
    history = {f"c{i}": [user(f"{LONG} {i}")] for i in range(CONVERSATIONS)}
    async with aiohttp.ClientSession() as http:
        keep, leaving = s.decode_urls
        for i, c in enumerate(history):  # turn 1: half the conversations on each decode
            _publish(s, {leaving if i % 2 else keep: False})
            assert await _turn(http, s, history, c) == "miss"
        _publish(s, {keep: False, leaving: False})
        if drain:
            _publish(s, {keep: False, leaving: True})
            outcomes = [await _turn(http, s, history, c) for c in history]  # every one moves
            decoded_by_leaving = len(s.decodes[1].requests)
            _publish(s, {keep: False})
        else:
            decoded_by_leaving = len(s.decodes[1].requests)
            _publish(s, {keep: False})
            outcomes = [await _turn(http, s, history, c) for c in history]
        outcomes += [await _turn(http, s, history, c) for c in history]  # after it is gone
    assert len(s.decodes[1].requests) == decoded_by_leaving  # no turn decoded on the leaving one
    assert all(r.correct for r in s.cluster.reads)
    return sum(o != "hit" for o in outcomes), outcomes


@pytest.mark.parametrize("drain", [False, True], ids=["at_once", "drained"])
async def test_scaling_decode_2_to_1_loses_no_reuse_when_the_leaving_decode_drains(
    make_stack: StackFactory, drain: bool
) -> None:
    n, outcomes = await _lost_reuse_scaling_2_to_1(make_stack, drain)
    if drain:
        assert n == 0, outcomes
    else:  # the conversations that decode-1 held recompute once
        assert n == CONVERSATIONS // 2 and outcomes.count("expired") == n, outcomes


async def test_a_draining_decode_takes_no_new_conversation(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(n_decode=2)
    _publish(s, {s.decode_urls[0]: False, s.decode_urls[1]: True})
    for i in range(4):
        status, _, _ = await chat(http, s.url, [user(LONG)], conversation=f"new-{i}")
        assert status == 200
    assert s.decodes[1].requests == [] and len(s.decodes[0].requests) == 4


async def test_with_only_draining_decodes_the_router_is_not_ready(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack()
    _publish(s, {s.decode_urls[0]: True})
    async with http.get(s.url + "/ready") as r:
        assert r.status == 503


async def test_the_router_counts_what_a_decode_holds_until_its_conversations_move(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(n_decode=2)
    keep, leaving = s.decode_urls
    history: dict[str, list[dict[str, Any]]] = {}
    _publish(s, {leaving: False})
    for c in ("a", "b"):
        _, _, data = await chat(http, s.url, [user(LONG + c)], conversation=c)
        history[c] = [user(LONG + c), assistant(data["choices"][0]["message"]["content"]), user("more")]

    def held(url: str) -> int | None:
        return drain.holding(s.url, url)

    assert await asyncio.to_thread(held, leaving) == 2 and await asyncio.to_thread(held, keep) == 0
    _publish(s, {keep: False, leaving: True})
    for c, msgs in history.items():
        _, h, _ = await chat(http, s.url, msgs, conversation=c)
        assert h["X-PDX-Reuse"] == "hit"
    assert await asyncio.to_thread(held, leaving) == 0 and await asyncio.to_thread(held, keep) == 2
    async with http.get(s.url + "/v1/pdx/holding") as r:
        assert r.status == 400 and "decode" in (await r.json())["error"]["message"]
