"""Conversation entries: an in-memory LRU (default) and Redis (shared by router replicas).

Entries are single use: decode frees its blocks once prefill has read them, so `take` removes
the entry atomically. That also stops two concurrent turns of one conversation from both
pointing prefill at the same blocks. Entries are kept a little past their deadline (`grace`)
so that the router can tell an expired entry from a miss.

Both stores are bounded three ways, each entry's size estimated once when it is put
(`Entry.nbytes` in memory, the serialized value in Redis):

- `max_entries` and `max_bytes` for the whole store: beyond either, the entries closest to
  their deadline go first (with one TTL for all, the oldest);
- `max_bytes_per_tenant`: a tenant beyond its share drops its *own* oldest entries, so one
  tenant's traffic can never push out another's entries (only the whole store filling up
  can, and then oldest first, whoever they belong to).

An entry larger than a tenant's share (or the whole store) is not kept at all: the next
turn of that conversation is a miss, and nothing else is evicted for it.

A completions turn kept by its prompt (policy/prompt_history.py) is also listed in its head's
index: its length, under a key bound to its tenant and KV scope. An index lists the
`HEAD_ENTRIES` most recent entries (a newer one drops the oldest entry, which no lookup could
find any more), an entry leaves it when it goes, and its bytes count in the entry's size, so
in both bounds above.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

from .entries import Entry

GRACE_SECONDS = 120.0
# Each Redis call waits at most this long (connect or answer). A Redis that hangs would
# otherwise hold every turn for redis-py's 5 s default, twice (take, then put); the router
# goes on without the store instead. Redis answers in well under a millisecond.
REDIS_TIMEOUT_SECONDS = 1.0
HEAD_ENTRIES = 8  # the entries a prompt head's index lists, the most recent
# What listing an entry in a head's index costs in memory: its slot in the head's dict and the
# key-to-head map, the head's key, and a share of the head's dict (tracemalloc, 300 to 1400
# entries: 240-390 bytes for an entry alone under its head, ~200 for one of 8).
INDEX_ENTRY_BYTES = 512


class Store(Protocol):
    async def take(self, key: str) -> Entry | None: ...

    async def take_first(self, keys: Sequence[str]) -> Entry | None:
        """Take the entry of the first key that holds one (a history's, longest first), in
        one atomic step: two turns continuing one history never both get it."""
        ...

    async def put(self, key: str, entry: Entry, head: str | None = None, length: int = 0) -> None:
        """Keep `entry` under `key`, bounded by `entry.tenant`'s share; with `head`, list its
        `length` in that head's index."""
        ...

    async def lengths(self, heads: Sequence[str]) -> list[int]:
        """The lengths the indexes of these heads list (a completions prompt's lookup)."""
        ...

    async def count(self) -> int: ...

    async def holding(self, decode_url: str, generation: str) -> int:
        """Live entries whose KV this decode holds, of this generation: what a decode being
        scaled away waits for (its conversations move, or their entries expire)."""
        ...

    async def close(self) -> None: ...


class MemoryStore:
    """Bounded LRU; with one TTL for all entries insertion order is also deadline order."""

    def __init__(
        self,
        max_entries: int,
        max_bytes: int | None = None,
        max_bytes_per_tenant: int | None = None,
        grace: float = GRACE_SECONDS,
    ) -> None:
        self._items: OrderedDict[str, Entry] = OrderedDict()
        self._sizes: dict[str, int] = {}  # each entry's nbytes(), estimated once at put
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}  # each tenant's keys, oldest first
        self._tenant_bytes: dict[str, int] = {}
        # each decode's keys of each generation, oldest first: what `holding` counts
        self._by_holder: dict[tuple[str, str], OrderedDict[str, None]] = {}
        # each prompt head's entries, oldest first, with their lengths; and each listed entry's head
        self._heads: dict[str, dict[str, int]] = {}  # (a dict keeps insertion order)
        self._head_of: dict[str, str] = {}
        self._bytes = 0
        self._max = max_entries
        self._max_bytes = max_bytes
        self._max_tenant = max_bytes_per_tenant if max_bytes_per_tenant is not None else max_bytes
        self._grace = grace

    def _drop(self, key: str) -> Entry | None:
        entry = self._items.pop(key, None)
        if entry is not None:
            size = self._sizes.pop(key)
            self._bytes -= size
            held = self._by_holder[entry.decode_url, entry.generation]
            del held[key]
            if not held:
                del self._by_holder[entry.decode_url, entry.generation]
            head = self._head_of.pop(key, None)
            if head is not None:
                listed = self._heads[head]
                del listed[key]
                if not listed:
                    del self._heads[head]
            keys = self._by_tenant[entry.tenant]
            del keys[key]
            if keys:
                self._tenant_bytes[entry.tenant] -= size
            else:  # no bookkeeping left behind for tenants that come and go
                del self._by_tenant[entry.tenant]
                del self._tenant_bytes[entry.tenant]
        return entry

    def _over(self) -> bool:
        return len(self._items) > self._max or (self._max_bytes is not None and self._bytes > self._max_bytes)

    def _sweep(self, now: float) -> None:
        items = self._items
        while items:
            key, entry = next(iter(items.items()))
            if entry.deadline + self._grace > now and not self._over():
                break
            self._drop(key)

    async def take(self, key: str) -> Entry | None:
        return self._drop(key)

    async def take_first(self, keys: Sequence[str]) -> Entry | None:
        for key in keys:
            if (entry := self._drop(key)) is not None:
                return entry
        return None

    async def put(self, key: str, entry: Entry, head: str | None = None, length: int = 0) -> None:
        self._drop(key)
        size, tenant = entry.nbytes() + (INDEX_ENTRY_BYTES if head is not None else 0), entry.tenant
        if self._max_tenant is not None and size > self._max_tenant:
            self._sweep(time.time())
            return  # larger than a tenant may hold: keeping it would only evict the rest
        self._items[key] = entry
        self._sizes[key] = size
        self._by_tenant.setdefault(tenant, OrderedDict())[key] = None
        self._by_holder.setdefault((entry.decode_url, entry.generation), OrderedDict())[key] = None
        self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + size
        self._bytes += size
        if head is not None:
            listed = self._heads.setdefault(head, {})
            listed[key] = length
            self._head_of[key] = head
            if len(listed) > HEAD_ENTRIES:
                self._drop(next(iter(listed)))
        if self._max_tenant is not None:
            while self._tenant_bytes[tenant] > self._max_tenant:
                self._drop(next(iter(self._by_tenant[tenant])))
        self._sweep(time.time())

    async def lengths(self, heads: Sequence[str]) -> list[int]:
        listed = self._heads
        return [n for head in heads if head in listed for n in listed[head].values()]

    async def count(self) -> int:
        self._sweep(time.time())
        return len(self._items)

    async def nbytes(self) -> int:
        """The estimated bytes of the entries held (what max_bytes bounds)."""
        self._sweep(time.time())
        return self._bytes

    async def holding(self, decode_url: str, generation: str) -> int:
        """Any client can ask (the router's port): it reads that decode's keys, not the store."""
        now, items = time.time(), self._items
        return sum(1 for key in self._by_holder.get((decode_url, generation), ()) if items[key].deadline > now)

    async def close(self) -> None:
        self._items.clear()
        self._sizes.clear()
        self._by_tenant.clear()
        self._by_holder.clear()
        self._heads.clear()
        self._head_of.clear()
        self._tenant_bytes.clear()
        self._bytes = 0


# The Redis store's bookkeeping, kept by these scripts so that every change is atomic (a
# script runs alone on the server). Keys, under the store's prefix P:
#   P<key>        the entry (a string with a TTL)
#   Pindex        sorted set: every entry's key, scored by when it may go (deadline + grace)
#   Psize, Powner hashes: each entry's size in bytes, and its tenant's id
#   Pbytes        the bytes of all entries; Ptbytes: a hash, the bytes per tenant id
#   Ptenant:<id>  sorted set: one tenant's entries, scored like the index
#   Pholder       hash: each entry's holder id (its decode and generation, see holder_id)
#   Pholds:<id>   sorted set: the entries one decode holds of one generation, scored like the index
#   Phead:<head>  sorted set: a prompt head's index, members `<length>:<entry's key>`, scored like
#                 the index; Pin: a hash, each listed entry's `<length>:<head>`
# Entries written by earlier routers are in the index but have no size: they count as 0 and
# leave within one TTL. The scripts name keys they compute from the prefix, so the store
# runs on one Redis (or a replicated primary), not on Redis Cluster.
_LUA_COMMON = """
local P = ARGV[1]
local index, sizes, owners, total, tbytes = P..'index', P..'size', P..'owner', P..'bytes', P..'tbytes'
local holders, listed = P..'holder', P..'in'
local function drop(k)
  local size = tonumber(redis.call('HGET', sizes, k) or '0')
  local owner = redis.call('HGET', owners, k)
  local holder = redis.call('HGET', holders, k)
  if holder then
    redis.call('ZREM', P..'holds:'..holder, k)
    redis.call('HDEL', holders, k)
  end
  local where = redis.call('HGET', listed, k)
  if where then
    local n, head = string.match(where, '^(%d+):(.*)$')
    redis.call('ZREM', P..'head:'..head, n..':'..k)
    redis.call('HDEL', listed, k)
  end
  redis.call('DEL', k)
  redis.call('ZREM', index, k)
  redis.call('HDEL', sizes, k)
  redis.call('HDEL', owners, k)
  redis.call('DECRBY', total, size)
  if owner then
    local tz = P..'tenant:'..owner
    redis.call('ZREM', tz, k)
    if redis.call('ZCARD', tz) == 0 then
      redis.call('HDEL', tbytes, owner)
    else
      redis.call('HINCRBY', tbytes, owner, -size)
    end
  end
end
local function sweep(now)
  for _, k in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', now)) do drop(k) end
end
"""
# ARGV: prefix, key, now -> the entry's value or nil
_LUA_TAKE = (
    _LUA_COMMON
    + """
local k = P..ARGV[2]
local value = redis.call('GET', k)
drop(k)
return value
"""
)
# ARGV: prefix, then keys -> the value of the first key that holds one, or nil
_LUA_TAKE_FIRST = (
    _LUA_COMMON
    + """
for i = 2, #ARGV do
  local k = P..ARGV[i]
  local value = redis.call('GET', k)
  if value then
    drop(k)
    return value
  end
end
return nil
"""
)
# ARGV: prefix, key, value, keep_ms, score, now, size, tenant id, max entries, max bytes,
# max bytes per tenant (0: no bound), holder id, prompt head ('': none), length, entries a
# head lists -> 1 if kept
_LUA_PUT = (
    _LUA_COMMON
    + """
local k, value, keep_ms, score, now = P..ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local size, owner = tonumber(ARGV[7]), ARGV[8]
local max_entries, max_bytes, max_tenant = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
drop(k)
sweep(now)
if (max_tenant > 0 and size > max_tenant) or (max_bytes > 0 and size > max_bytes) then return 0 end
local tz = P..'tenant:'..owner
redis.call('SET', k, value, 'PX', keep_ms)
redis.call('ZADD', index, score, k)
redis.call('ZADD', tz, score, k)
redis.call('HSET', sizes, k, size)
redis.call('HSET', owners, k, owner)
redis.call('INCRBY', total, size)
redis.call('HINCRBY', tbytes, owner, size)
redis.call('HSET', holders, k, ARGV[12])
redis.call('ZADD', P..'holds:'..ARGV[12], score, k)
if ARGV[13] ~= '' then
  local hz = P..'head:'..ARGV[13]
  redis.call('HSET', listed, k, ARGV[14]..':'..ARGV[13])
  redis.call('ZADD', hz, score, ARGV[14]..':'..k)
  while redis.call('ZCARD', hz) > tonumber(ARGV[15]) do
    drop(string.match(redis.call('ZRANGE', hz, 0, 0)[1], '^%d+:(.*)$'))
  end
end
if max_tenant > 0 then
  while tonumber(redis.call('HGET', tbytes, owner) or '0') > max_tenant do
    local oldest = redis.call('ZRANGE', tz, 0, 0)[1]
    if not oldest then break end
    drop(oldest)
  end
end
while redis.call('ZCARD', index) > max_entries
    or (max_bytes > 0 and tonumber(redis.call('GET', total) or '0') > max_bytes) do
  local oldest = redis.call('ZRANGE', index, 0, 0)[1]
  if not oldest then break end
  drop(oldest)
end
return 1
"""
)
# ARGV: prefix, then heads -> the lengths their indexes list
_LUA_LENGTHS = """
local out = {}
for i = 2, #ARGV do
  for _, m in ipairs(redis.call('ZRANGE', ARGV[1]..'head:'..ARGV[i], 0, -1)) do
    out[#out + 1] = tonumber(string.match(m, '^(%d+):'))
  end
end
return out
"""
# ARGV: prefix, now, holder id, the lowest score of a live entry (now + grace) -> entries
_LUA_HOLDING = (
    _LUA_COMMON
    + """
sweep(ARGV[2])
return redis.call('ZCOUNT', P..'holds:'..ARGV[3], '('..ARGV[4], '+inf')
"""
)
# ARGV: prefix, now -> {entries, bytes}
_LUA_USAGE = (
    _LUA_COMMON
    + """
sweep(ARGV[2])
return {redis.call('ZCARD', index), tonumber(redis.call('GET', total) or '0')}
"""
)


def _index_bytes(key: str, head: str, length: int) -> int:
    """What an entry's listing in a head's index takes in Redis: its member in the head's sorted
    set and its field in Pin (the key twice, the head, the length twice), plus the two
    structures' per-element overhead (~64 bytes each)."""
    return 2 * (len(key) + len(str(length)) + 1) + len(head) + 128


def holder_id(decode_url: str, generation: str) -> str:
    """A decode and generation in Redis keys."""
    return hashlib.sha256(f"{decode_url}\x00{generation}".encode()).hexdigest()[:32]


def tenant_id(tenant: str) -> str:
    """A tenant's name in Redis keys: a header's value may be of any length or charset."""
    return hashlib.sha256(tenant.encode(errors="surrogatepass")).hexdigest()[:32]


class RedisStore:
    """Entries as Redis strings with a TTL, plus the bookkeeping above (sizes, tenants)."""

    def __init__(
        self,
        url: str,
        key_prefix: str,
        max_entries: int,
        max_bytes: int | None = None,
        max_bytes_per_tenant: int | None = None,
        grace: float = GRACE_SECONDS,
    ) -> None:
        import redis.asyncio as aioredis

        self._redis = aioredis.Redis.from_url(
            url, socket_timeout=REDIS_TIMEOUT_SECONDS, socket_connect_timeout=REDIS_TIMEOUT_SECONDS
        )
        self._prefix = key_prefix
        self._max = max_entries
        self._max_bytes = max_bytes or 0
        tenant_bound = max_bytes_per_tenant if max_bytes_per_tenant is not None else max_bytes
        self._max_tenant = tenant_bound or 0
        self._grace = grace
        self._take = self._redis.register_script(_LUA_TAKE)
        self._take_first = self._redis.register_script(_LUA_TAKE_FIRST)
        self._put = self._redis.register_script(_LUA_PUT)
        self._usage = self._redis.register_script(_LUA_USAGE)
        self._holding = self._redis.register_script(_LUA_HOLDING)
        self._lengths = self._redis.register_script(_LUA_LENGTHS)

    async def take(self, key: str) -> Entry | None:
        raw = await self._take(args=[self._prefix, key, time.time()])
        return Entry.from_bytes(raw) if raw is not None else None

    async def take_first(self, keys: Sequence[str]) -> Entry | None:
        raw = await self._take_first(args=[self._prefix, *keys])
        return Entry.from_bytes(raw) if raw is not None else None

    async def put(self, key: str, entry: Entry, head: str | None = None, length: int = 0) -> None:
        now = time.time()
        keep_ms = max(1, int((entry.deadline - now + self._grace) * 1000))
        value = entry.to_bytes()
        size = len(value) + (_index_bytes(self._prefix + key, head, length) if head is not None else 0)
        args: list[Any] = [self._prefix, key, value, keep_ms, entry.deadline + self._grace, now, size]
        args += [tenant_id(entry.tenant), self._max, self._max_bytes, self._max_tenant]
        args += [holder_id(entry.decode_url, entry.generation), head or "", length, HEAD_ENTRIES]
        await self._put(args=args)

    async def lengths(self, heads: Sequence[str]) -> list[int]:
        if not heads:
            return []
        return [int(n) for n in await self._lengths(args=[self._prefix, *heads])]

    async def _entries_and_bytes(self) -> tuple[int, int]:
        entries, nbytes = await self._usage(args=[self._prefix, time.time()])
        return int(entries), int(nbytes)

    async def count(self) -> int:
        return (await self._entries_and_bytes())[0]

    async def nbytes(self) -> int:
        """The bytes of the entries' values in Redis (what max_bytes bounds)."""
        return (await self._entries_and_bytes())[1]

    async def holding(self, decode_url: str, generation: str) -> int:
        now = time.time()
        return int(await self._holding(args=[self._prefix, now, holder_id(decode_url, generation), now + self._grace]))

    async def close(self) -> None:
        await self._redis.aclose()
