"""The operator's own list+watch of its child kinds and pods, one stream per kind.

Why not kopf's: kopf runs its whole per-event machinery (cause detection, diff-base copies,
handler and index invocation) for each of the ~13 child events a new resource causes, which
cost more CPU than the pass itself. The operator needs far less of a child event: file the
object under its (namespace, instance), and for the kinds whose events trigger a pass
(`Kind.watched`), tell the handlers. kopf keeps the DisaggregatedInference itself.

Each `Feed` lists its kind with the server-side label selector the operator's objects carry,
then watches from the listing's resourceVersion (bookmarks asked for, so a quiet kind's
version stays fresh), parsed with orjson. A watch that ends is resumed from the last version
seen; an expired version (410 Gone) or any other failure lists again, and a new listing
replaces the kind's store: what it lacks is dropped (a lost deletion cannot linger). The
differences a relisting finds are reported as the events they stand for. The first listing
of every feed sets `listed`: the handlers act on nothing before it (complete state).

Everything runs on kopf's event loop, where the handlers take their snapshots, so the store
needs no lock.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from kubernetes import client as k8s_client

from pdx import kinds
from pdx.controller.kube import ssl_context
from pdx.controller.state import index_key

log = logging.getLogger(__name__)

WATCH_SECONDS = 290  # the server ends each watch after this long; the feed resumes it
RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)  # after failures in a row; then every 10 s
ABSENT_RETRY_SECONDS = 60.0  # a kind the server does not serve (a missing CRD): look again
LIST_PAGE = 500

Notify = Callable[[str, dict[str, Any]], None]  # (event type, object) after the first listing


class Expired(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class Absent(Exception):
    """The server does not serve this kind (404 on the listing)."""


@dataclass
class Store:
    """One kind's objects, by (namespace, name) and by (namespace, instance).

    `get(where, default)` answers as a kopf index does, so `WatchState` reads either."""

    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    by_instance: dict[tuple[str, str], dict[str, dict[str, Any]]] = field(default_factory=dict)

    def get(self, where: tuple[str, str], default: Iterable[dict[str, Any]] = ()) -> Iterable[dict[str, Any]]:
        found = self.by_instance.get(where)
        return list(found.values()) if found else default

    def put(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """File `obj`; the copy it replaces, if any."""
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        old = self.objects.get(key)
        if old is not None:
            self._unfile(old, key[1])
        self.objects[key] = obj
        if (where := index_key(obj)) is not None:
            self.by_instance.setdefault(where, {})[key[1]] = obj
        return old

    def remove(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        old = self.objects.pop(key, None)
        if old is not None:
            self._unfile(old, key[1])
        return old

    def _unfile(self, old: Mapping[str, Any], name: str) -> None:
        if (where := index_key(old)) is not None and (filed := self.by_instance.get(where)) is not None:
            filed.pop(name, None)
            if not filed:
                del self.by_instance[where]


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _selected(obj: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    """Filtered here too: a server (or a mock) that ignores the selector sends everything."""
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in selector.items())


@dataclass
class Http:
    """aiohttp to the API server, with the address, TLS and token of the operator's client."""

    config: k8s_client.Configuration
    _session: aiohttp.ClientSession | None = field(default=None, init=False, repr=False)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl(), limit=0),
                json_serialize=lambda o: orjson.dumps(o).decode(),
            )
        return self._session

    def _ssl(self) -> ssl.SSLContext | bool:
        return ssl_context(self.config) if str(self.config.host).startswith("https") else False

    def headers(self) -> dict[str, str]:
        """Read on each (re)connect: an in-cluster token file is rotated by the kubelet."""
        setting = self.config.auth_settings().get("BearerToken")
        out = {"Accept": "application/json"}
        if setting and setting.get("value"):
            out[str(setting["key"])] = str(setting["value"])
        return out

    def url(self, path: str) -> str:
        return f"{str(self.config.host).rstrip('/')}{path}"

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


@dataclass
class Feed:
    """One kind (in one namespace, or all): a store kept current by list and watch."""

    http: Http
    kind: kinds.Kind
    selector: Mapping[str, str]
    namespace: str | None = None  # None: all namespaces
    notify: Notify | None = None
    store: Store = field(default_factory=Store)
    listed: asyncio.Event = field(default_factory=asyncio.Event)
    version: str = ""  # the resourceVersion to watch from

    def path(self) -> str:
        root = f"/api/{self.kind.api_version}" if "/" not in self.kind.api_version else f"/apis/{self.kind.api_version}"
        where = f"/namespaces/{self.namespace}" if self.namespace else ""
        return f"{root}{where}/{self.kind.plural}"

    def _query(self) -> dict[str, str]:
        return {"labelSelector": ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))}

    async def run(self) -> None:
        """List, watch, and again, until cancelled; failures back off and list anew."""
        failures = 0
        while True:
            try:
                await self.relist()
                failures = 0
                while True:
                    began = asyncio.get_running_loop().time()
                    await self.watch()  # returns when the server ends the stream: resume
                    if asyncio.get_running_loop().time() - began < 1.0:
                        await asyncio.sleep(1.0)  # a server that ends every watch at once is not hammered
            except asyncio.CancelledError:
                raise
            except Absent:
                self.listed.set()  # nothing of ours can exist there; do not hold the handlers back
                await asyncio.sleep(ABSENT_RETRY_SECONDS)
            except Expired:
                log.debug("%s: resourceVersion %s expired; listing again", self.kind.plural, self.version)
            except Exception as err:  # transport, 5xx, a malformed line: list again after a pause
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                log.warning("%s feed failed (%s); listing again in %.1f s", self.kind.plural, err, delay)
                await asyncio.sleep(delay)

    async def relist(self) -> None:
        """A full listing replaces the store; differences become events (not the first time)."""
        items: list[dict[str, Any]] = []
        query = {**self._query(), "limit": str(LIST_PAGE)}
        version = ""
        while True:
            async with self.http.session().get(
                self.http.url(self.path()), params=query, headers=self.http.headers()
            ) as resp:
                if resp.status == 404:
                    raise Absent()
                if resp.status == 410:
                    raise Expired()  # a continue token expired mid-listing
                if resp.status != 200:
                    raise RuntimeError(f"LIST {self.path()}: HTTP {resp.status}: {(await resp.read())[:300]!r}")
                page = orjson.loads(await resp.read())
            items += page.get("items") or []
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion") or "")
            if not meta.get("continue"):
                break
            query = {**query, "continue": str(meta["continue"])}
        fresh = Store()
        for obj in items:
            self._complete(obj)
            if _selected(obj, self.selector):
                fresh.put(obj)
        old, self.store = self.store, fresh
        self.version = version
        if self.listed.is_set() and self.notify is not None:
            for key, obj in fresh.objects.items():
                before = old.objects.get(key)
                if before is None or _version(before) != _version(obj):
                    self.notify("ADDED" if before is None else "MODIFIED", obj)
            for key, obj in old.objects.items():
                if key not in fresh.objects:
                    self.notify("DELETED", obj)
        self.listed.set()

    async def watch(self) -> None:
        query = {**self._query(), "watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_SECONDS)}
        if self.version:
            query["resourceVersion"] = self.version
        # A bound on the whole stream, not on each read: the server ends it after WATCH_SECONDS,
        # so a silent connection is still given up 60 s later, and aiohttp does not re-arm a
        # read timer for every chunk (a tenth of the operator's CPU with the real controllers'
        # pod and status events).
        timeout = aiohttp.ClientTimeout(total=WATCH_SECONDS + 60, sock_connect=10)
        url = self.http.url(self.path())
        async with self.http.session().get(url, params=query, headers=self.http.headers(), timeout=timeout) as resp:
            if resp.status == 410:
                raise Expired()
            if resp.status == 404:
                raise Absent()
            if resp.status != 200:
                raise RuntimeError(f"WATCH {self.path()}: HTTP {resp.status}: {(await resp.read())[:300]!r}")
            parts: list[bytes] = []  # the line being received, in pieces: a chunk without its end is only kept
            async for chunk in resp.content.iter_any():
                if b"\n" not in chunk:
                    parts.append(chunk)
                    continue
                parts.append(chunk)
                *lines, rest = b"".join(parts).split(b"\n")
                parts = [rest] if rest else []
                for line in lines:
                    if line.strip():
                        self.apply(orjson.loads(line))

    def apply(self, event: Mapping[str, Any]) -> None:
        """One watch event into the store (and to `notify`, unless it changes nothing)."""
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Expired()
            raise RuntimeError(f"watch error: {obj.get('message') or obj}")
        if not isinstance(obj.get("metadata"), dict):
            return
        version = _version(obj)
        if version:
            self.version = version
        if kind == "BOOKMARK":
            return
        self._complete(obj)
        if kind == "DELETED" or not _selected(obj, self.selector):  # a relabelled object left the selector
            old = self.store.remove(obj)
            if old is not None and self.notify is not None:
                self.notify("DELETED", obj)
            return
        old = self.store.put(obj)
        if self.notify is not None and (old is None or _version(old) != version):
            self.notify(str(kind), obj)  # a watch (re)start replaying what the store has is no change

    def _complete(self, obj: dict[str, Any]) -> None:
        """List items and some servers' events omit apiVersion and kind; the state keys by kind."""
        obj.setdefault("apiVersion", self.kind.api_version)
        obj.setdefault("kind", self.kind.kind)


@dataclass
class Feeds:
    """Every child kind and pods, for the namespaces the operator serves (None: all)."""

    http: Http
    feeds: dict[kinds.Kind, list[Feed]]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        config: k8s_client.Configuration,
        selectors: Mapping[kinds.Kind, Mapping[str, str]],
        namespaces: Iterable[str] | None,
        notify: Callable[[kinds.Kind], Notify | None],
    ) -> Feeds:
        http = Http(config)
        where: list[str | None] = list(namespaces) if namespaces else [None]
        return cls(http, {k: [Feed(http, k, sel, ns, notify(k)) for ns in where] for k, sel in selectors.items()})

    def start(self) -> None:
        for feed in (f for fs in self.feeds.values() for f in fs):
            self.tasks.append(asyncio.get_running_loop().create_task(feed.run(), name=f"pdx-feed-{feed.kind.plural}"))

    async def listed(self) -> None:
        """Until every feed has its first listing."""
        await asyncio.gather(*(f.listed.wait() for fs in self.feeds.values() for f in fs))

    def view(self, kind: kinds.Kind) -> _View:
        return _View(self.feeds[kind])

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.http.close()


@dataclass(frozen=True)
class _View:
    """A kind's stores as one index: (namespace, instance) -> objects."""

    feeds: list[Feed]

    def get(self, where: tuple[str, str], default: Iterable[dict[str, Any]] = ()) -> Iterable[dict[str, Any]]:
        for feed in self.feeds:
            if feed.namespace is None or feed.namespace == where[0]:
                return feed.store.get(where, default)
        return default


__all__ = ["Feed", "Feeds", "Store"]
