"""Dropped claims on decode's held KV, sent with the next claim to the same decode, or alone
after a short wait (`pdx_contract.holds`).

Every reused turn claims its hold before prefill reads it and drops the claim once prefill has
answered. Sending each drop on its own would double the router's calls to decode, so the drop
rides along with the next claim to that decode, or goes alone after `flush_seconds`. A drop
matters only for a hold prefill did not read (one it read is freed by decode anyway), so it
can wait: the hold stays pinned that much longer, and pressure releases another hold first.
A drop lost with a failed call leaves the hold to a read or the TTL, as without pdx's valve.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from pdx_contract.holds import MAX_IDS, PATH, HoldsAnswer, HoldsRequest

from .endpoints import Endpoint
from .errors import ClientFacingError, MalformedAnswer, UpstreamError
from .policy import holds
from .upstream import Upstream

log = logging.getLogger("pdx_router.claims")

FLUSH_SECONDS = 1.0


async def holds_call(
    upstream: Upstream, decode: Endpoint, claim: list[str], drops: list[str], headers: dict[str, str]
) -> tuple[int, HoldsAnswer | None]:
    """POST /v1/pdx/holds: the status (0: no answer) and decode's answer, if it is one; the
    holds it names as released early are noted on `decode` (`Endpoint.note_releases`). Claims
    are leased: the router caps each read at the answer's `claim_expiry` (`holds.after_claim`)."""
    request = HoldsRequest(claim=claim, release_claim=drops, since=decode.released_seq, lease=True)
    try:
        head, raw = await upstream.post(decode, PATH, orjson.dumps(request.to_json()), headers, total=True)
        status, body = head.status, orjson.loads(raw)
    except ClientFacingError as exc:
        return exc.status, None
    except (UpstreamError, MalformedAnswer) as exc:
        log.warning("holds call on %s failed: %s", decode.url, exc)
        return (0 if exc.status is None else exc.status), None
    except orjson.JSONDecodeError:
        return 200, None
    answer = holds.parse(status, body)
    if answer is not None:
        decode.note_releases(answer.released, answer.seq, covered=answer.covered, kept=answer.kept)
        decode.held_kv = answer
    return status, answer


Send = Callable[[Endpoint, list[str], dict[str, str]], Coroutine[Any, Any, None]]
_Key = tuple[str, tuple[tuple[str, str], ...]]  # the decode's URL, and the headers the call needs


class ClaimDrops:
    """Pending drops per decode (and per engine headers: a call carries one client's auth)."""

    def __init__(self, send: Send, flush_seconds: float = FLUSH_SECONDS) -> None:
        self.send = send
        self.flush_seconds = flush_seconds
        self._pending: dict[_Key, tuple[Endpoint, list[str]]] = {}
        self._timers: dict[_Key, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def add(self, decode: Endpoint, hold: str, headers: dict[str, str]) -> None:
        key = (decode.url, tuple(sorted(headers.items())))
        self._pending.setdefault(key, (decode, []))[1].append(hold)
        if key not in self._timers:
            self._timers[key] = asyncio.get_running_loop().call_later(self.flush_seconds, self._flush, key)

    def take(self, decode: Endpoint, headers: dict[str, str]) -> list[str]:
        """The drops a claim to `decode` with these headers carries (at most MAX_IDS)."""
        key = (decode.url, tuple(sorted(headers.items())))
        entry = self._pending.get(key)
        if entry is None:
            return []
        taken, rest = entry[1][:MAX_IDS], entry[1][MAX_IDS:]
        if rest:
            self._pending[key] = (entry[0], rest)
        else:
            del self._pending[key]
            timer = self._timers.pop(key, None)
            if timer is not None:
                timer.cancel()
        return taken

    def _flush(self, key: _Key) -> None:
        self._timers.pop(key, None)
        entry = self._pending.pop(key, None)
        if entry is None:
            return
        decode, drops = entry
        for start in range(0, len(drops), MAX_IDS):
            task = asyncio.create_task(self.send(decode, drops[start : start + MAX_IDS], dict(key[1])))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def pending(self) -> int:
        return sum(len(drops) for _, drops in self._pending.values())
