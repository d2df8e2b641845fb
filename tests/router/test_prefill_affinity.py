"""Prefill affinity end to end: every turn of a conversation reaches one prefill, so its prefix
cache may hold the history; without it, the least loaded prefill takes each turn."""

from __future__ import annotations

import aiohttp

from .conftest import Stack, StackFactory
from .helpers import LONG, assistant, chat, user


async def _conversation(http: aiohttp.ClientSession, url: str, name: str, conversation: str | None) -> None:
    msgs = [{"role": "system", "content": f"agent {name}"}, user(f"{name} {LONG}")]
    for turn in range(3):
        status, _, data = await chat(http, url, msgs, conversation=conversation)
        assert status == 200
        msgs += [assistant(data["choices"][0]["message"]["content"]), user(f"{name} turn {turn}")]


def _prefill_of(stack: Stack, name: str) -> set[int]:
    """Which prefills served the turns whose first user message names `name`."""
    served = set()
    for i, prefill in enumerate(stack.prefills):
        for path, body in prefill.requests:
            contents = [str(m.get("content")) for m in body.get("messages", [])]
            if path != "/tokenize" and any(c.startswith(f"{name} ") for c in contents):
                served.add(i)
    return served


async def test_with_affinity_each_conversation_keeps_one_prefill_by_id_or_by_history(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(n_prefill=3, prefill_affinity=True)
    names = [f"conv{i}" for i in range(12)]
    for i, name in enumerate(names):
        await _conversation(http, s.url, name, conversation=name if i % 2 else None)  # half by id, half by history
    homes = [_prefill_of(s, name) for name in names]
    assert all(len(home) == 1 for home in homes)
    assert len(set().union(*homes)) > 1  # and the conversations spread over the prefills


async def test_without_affinity_the_least_loaded_prefill_takes_each_turn(
    make_stack: StackFactory, http: aiohttp.ClientSession
) -> None:
    s = await make_stack(n_prefill=3)
    for name in ("a", "b", "c"):
        await _conversation(http, s.url, name, conversation=name)
    # one client, so every prefill is idle at each turn: the first in the list takes them all
    assert [_prefill_of(s, name) for name in ("a", "b", "c")] == [{0}, {0}, {0}]
