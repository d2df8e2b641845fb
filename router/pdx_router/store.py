"""Conversation entries: an in-memory LRU (default) and Redis (shared by router replicas).

Entries are single use: decode frees its blocks once prefill has read them, so `take` removes
the entry atomically. That also stops two concurrent turns of one conversation from both
pointing prefill at the same blocks. Entries are kept a little past their deadline (`grace`)
so that the router can tell an expired entry from a miss.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Protocol

from .entries import Entry

GRACE_SECONDS = 120.0
# Each Redis call waits at most this long (connect or answer). A Redis that hangs would
# otherwise hold every turn for redis-py's 5 s default, twice (take, then put); the router
# goes on without the store instead. Redis answers in well under a millisecond.
REDIS_TIMEOUT_SECONDS = 1.0


class Store(Protocol):
    async def take(self, key: str) -> Entry | None: ...

    async def put(self, key: str, entry: Entry) -> None: ...

    async def count(self) -> int: ...

    async def close(self) -> None: ...


class MemoryStore:
    """Bounded LRU; with one TTL for all entries insertion order is also deadline order."""

    def __init__(self, max_entries: int, grace: float = GRACE_SECONDS) -> None:
        self._items: OrderedDict[str, Entry] = OrderedDict()
        self._max = max_entries
        self._grace = grace

    def _sweep(self, now: float) -> None:
        items = self._items
        while items:
            _key, entry = next(iter(items.items()))
            if entry.deadline + self._grace > now and len(items) <= self._max:
                break
            items.popitem(last=False)

    async def take(self, key: str) -> Entry | None:
        return self._items.pop(key, None)

    async def put(self, key: str, entry: Entry) -> None:
        self._items.pop(key, None)
        self._items[key] = entry
        self._sweep(time.time())

    async def count(self) -> int:
        self._sweep(time.time())
        return len(self._items)

    async def close(self) -> None:
        self._items.clear()


class RedisStore:
    """Entries as Redis strings with a TTL, plus a sorted set of deadlines for counting."""

    def __init__(self, url: str, key_prefix: str, max_entries: int, grace: float = GRACE_SECONDS) -> None:
        import redis.asyncio as aioredis

        self._redis = aioredis.Redis.from_url(
            url, socket_timeout=REDIS_TIMEOUT_SECONDS, socket_connect_timeout=REDIS_TIMEOUT_SECONDS
        )
        self._prefix = key_prefix
        self._index = f"{key_prefix}index"
        self._max = max_entries
        self._grace = grace

    async def take(self, key: str) -> Entry | None:
        k = self._prefix + key
        pipe = self._redis.pipeline(transaction=True)
        pipe.getdel(k)
        pipe.zrem(self._index, k)
        raw, _ = await pipe.execute()
        return Entry.from_bytes(raw) if raw is not None else None

    async def put(self, key: str, entry: Entry) -> None:
        k = self._prefix + key
        keep_ms = max(1, int((entry.deadline - time.time() + self._grace) * 1000))
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(k, entry.to_bytes(), px=keep_ms)
        pipe.zadd(self._index, {k: entry.deadline + self._grace})
        pipe.zremrangebyscore(self._index, "-inf", time.time())
        await pipe.execute()
        await self._trim()

    async def _trim(self) -> None:
        """Enforce maxEntries by dropping the entries closest to their deadline."""
        excess = int(await self._redis.zcard(self._index)) - self._max
        if excess > 0:
            oldest = await self._redis.zpopmin(self._index, excess)
            members = [item[0] for item in oldest if isinstance(item, tuple | list)]
            if members:
                await self._redis.delete(*members)

    async def count(self) -> int:
        await self._redis.zremrangebyscore(self._index, "-inf", time.time())
        return int(await self._redis.zcard(self._index))

    async def close(self) -> None:
        await self._redis.aclose()
