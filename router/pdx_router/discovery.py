"""Where the engines are: static URLs, the operator's endpoints file, DNS; and their health."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterable

import aiohttp
from pydantic import ValidationError

from pdx_contract import load
from pdx_contract.base import engine_url, problems
from pdx_contract.endpoints import EndpointsDocument, PublishedEndpoint, Role

from .claims import holds_call
from .config import ConfigError, RouterConfig
from .endpoints import Endpoint
from .policy import local
from .upstream import Upstream, block_size_from_metrics, load_from_metrics, read_load

FAILURE_THRESHOLD = 3

log = logging.getLogger("pdx_router.discovery")

ENDPOINTS_FILE_POLL_SECONDS = 2.0


class Pool:
    """The current endpoint set, merged from several sources.

    Endpoint objects survive refreshes (keyed by role+URL) so health and outstanding counts
    are not reset each time DNS or the file is re-read.
    """

    def __init__(self) -> None:
        self._by_source: dict[str, list[PublishedEndpoint]] = {}
        self._live: dict[tuple[str, str], Endpoint] = {}
        self.endpoints: list[Endpoint] = []

    def update(self, source: str, found: Iterable[PublishedEndpoint]) -> list[Endpoint]:
        """Replace one source's endpoints (each with its generation); returns the new ones."""
        self._by_source[source] = list(found)
        wanted: dict[tuple[str, str], PublishedEndpoint] = {}
        for items in self._by_source.values():
            for f in items:
                wanted.setdefault((f.role, f.url), f)
        new: list[Endpoint] = []
        live: dict[tuple[str, str], Endpoint] = {}
        for key, f in wanted.items():
            generation = f.generation or ""
            ep = self._live.get(key)
            if ep is None:
                ep = Endpoint(url=f.url, role=f.role, generation=generation, name=f.name, draining=f.draining)
                new.append(ep)
            else:
                ep.generation, ep.name, ep.draining = generation, f.name or ep.name, f.draining
            live[key] = ep
        self._live = live
        self.endpoints = list(live.values())
        return new


def static_endpoints(cfg: RouterConfig) -> list[PublishedEndpoint]:
    return [PublishedEndpoint(role="prefill", url=u, generation=cfg.generation) for u in cfg.prefill] + [
        PublishedEndpoint(role="decode", url=u, generation=cfg.generation) for u in cfg.decode
    ]


def read_endpoints_file(path: str, default_generation: str) -> list[PublishedEndpoint]:
    """The operator's endpoints file, each engine with its generation; ConfigError names the item."""
    with open(path, "rb") as fh:
        text = fh.read()
    try:
        doc = EndpointsDocument.model_validate_json(text)
    except ValidationError as err:
        raise ConfigError(f"{path}: " + "; ".join(problems(err))) from None
    return [e if e.generation else e.model_copy(update={"generation": default_generation}) for e in doc.endpoints]


async def resolve(name: str, port: int) -> list[str]:
    """A/AAAA records of a headless Service, as base URLs (sorted: stable order)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return sorted({engine_url(str(info[4][0]).split("%")[0], port) for info in infos})


class Discovery:
    """Runs the configured sources and the health checker in the background."""

    def __init__(self, cfg: RouterConfig, pool: Pool, upstream: Upstream) -> None:
        self.cfg = cfg
        self.pool = pool
        self.upstream = upstream
        self._tasks: list[asyncio.Task[None]] = []
        self._file_mtime: float | None = None
        self._file_has_endpoints = False
        self._fresh: dict[str, asyncio.Future[None]] = {}  # decode url -> its fresh look in flight

    async def start(self) -> None:
        """Load every source once and health-check before serving, so /ready is truthful."""
        self.pool.update("static", static_endpoints(self.cfg))
        if self.cfg.endpoints_file:
            self._poll_file()
            self._tasks.append(asyncio.create_task(self._file_loop()))
        if self.cfg.dns:
            await self._resolve_dns()
            self._tasks.append(asyncio.create_task(self._dns_loop()))
        await self.check_all()
        self._tasks.append(asyncio.create_task(self._health_loop()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()

    def _poll_file(self) -> None:
        path = self.cfg.endpoints_file
        assert path is not None
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            return  # the operator may not have written it yet
        if mtime == self._file_mtime:
            return
        try:
            found = read_endpoints_file(path, self.cfg.generation)
        except (OSError, ValueError) as exc:
            log.warning("endpoints file %s ignored: %s", path, exc)
            return
        self._file_mtime = mtime
        self._file_has_endpoints = bool(found)
        if found:
            # The operator's file names each pod's generation; DNS cannot, and would label
            # old-generation pods as the new one during a rollout. The file wins.
            self.pool.update("dns", [])
        for ep in self.pool.update("file", found):
            asyncio.get_running_loop().create_task(self.check(ep))

    async def _file_loop(self) -> None:
        while True:
            await asyncio.sleep(ENDPOINTS_FILE_POLL_SECONDS)
            self._poll_file()

    async def _resolve_dns(self) -> None:
        """Headless-Service DNS: the fallback while no endpoints file lists engines."""
        dns = self.cfg.dns
        assert dns is not None
        if self._file_has_endpoints:
            return
        found: list[PublishedEndpoint] = []
        roles: tuple[tuple[Role, str], ...] = (("prefill", dns.prefill), ("decode", dns.decode))
        for role, name in roles:
            try:
                urls = await resolve(name, dns.port)
            except OSError as exc:
                log.warning("DNS %s for %s failed: %s", name, role, exc)
                continue
            found += [PublishedEndpoint(role=role, url=u, generation=self.cfg.generation) for u in urls]
        for ep in self.pool.update("dns", found):
            await self.check(ep)

    async def _dns_loop(self) -> None:
        assert self.cfg.dns is not None
        while True:
            await asyncio.sleep(self.cfg.dns.refresh_seconds)
            await self._resolve_dns()

    async def check(self, ep: Endpoint) -> None:
        """GET /health; decode's block size comes from its /metrics (needed to cut blocks), and
        with decode-local on, its running and waiting requests at every check."""
        timeout = min(5.0, self.cfg.health_check_interval_seconds)
        try:
            status, _ = await self.upstream.get(ep.url + "/health", timeout)
            ok, definite = status == 200, False
        except aiohttp.ClientConnectorError:  # nothing listens: the engine is gone
            ok, definite = False, True
        except Exception:  # slow or odd answer: a busy engine, count it
            ok, definite = False, False
        ep.failures = 0 if ok else ep.failures + 1
        # Like a readiness probe's failureThreshold: a loaded engine answering /health late
        # must not take the whole fleet out of rotation.
        healthy = ok or (ep.healthy and not definite and ep.failures < FAILURE_THRESHOLD)
        if healthy != ep.healthy:
            log.info("%s %s is now %s", ep.role, ep.url, "healthy" if healthy else "unhealthy")
        ep.healthy = healthy
        load = self.cfg.decode_local_max_tokens > 0
        ep.others_load = None  # unknown until this check's scrape says
        if healthy and ep.role == "decode" and (ep.block_size is None or load):
            await self._scrape(ep, timeout)
        if healthy and ep.role == "decode" and ep.claims is not False:
            await self._poll_holds(ep)

    async def _scrape(self, ep: Endpoint, timeout: float) -> None:
        """Decode's block size (from /metrics, once), and with decode-local on the requests on it
        that are not ours: from pdx's load route where decode has it (`pdx_contract.load`),
        else from /metrics."""
        with contextlib.suppress(Exception):
            own = ep.outstanding
            ep.load_seen = time.monotonic()
            wants_load = self.cfg.decode_local_max_tokens > 0
            if wants_load and ep.block_size is not None and ep.load_route is not False:
                status, raw = await self.upstream.get(ep.url + load.PATH, timeout)
                if status == 200 and (n := read_load(raw)) is not None:
                    ep.load_route = True
                    ep.others_load = local.others_load(n, max(own, ep.outstanding))
                    return
                if status in (200, 404, 405, 501):  # no such route (or another at its path): /metrics from now on
                    ep.load_route = False
            status, text = await self.upstream.get(ep.url + "/metrics", timeout)
            if status == 200:
                ep.block_size = ep.block_size or block_size_from_metrics(text)
                if wants_load:
                    ep.others_load = local.others_load(load_from_metrics(text), max(own, ep.outstanding))

    async def fresh_load(self, ep: Endpoint) -> None:
        """Scrape a decode's load now (`local.worth_a_fresh_look`); turns that ask meanwhile
        share the one scrape, and a turn that goes away does not cancel it for the others."""
        task = self._fresh.get(ep.url)
        if task is None:
            task = self._fresh[ep.url] = asyncio.ensure_future(self._scrape(ep, local.FRESH_TIMEOUT_S))
            task.add_done_callback(lambda _: self._fresh.pop(ep.url, None))
        await asyncio.shield(task)

    async def _poll_holds(self, ep: Endpoint) -> None:
        """Decode's held KV figures, its valve, and the holds it released early (their turns then
        go plain without a claim): an empty holds call (`pdx_contract.holds`)."""
        try:
            status, answer = await holds_call(self.upstream, ep, [], [], {})
        except Exception as exc:  # the health check goes on: these figures are for metrics and stats
            log.debug("holds poll of %s failed: %s", ep.url, exc)
            status, answer = 0, None
        if status in (404, 405):
            ep.claims = False  # no route: an engine without pdx's valve
        if answer is None:
            ep.held_kv = None

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(ep) for ep in self.pool.endpoints))

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.health_check_interval_seconds)
            await self.check_all()
