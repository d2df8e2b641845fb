"""tests/operator's kmock API server in a process of its own, for scripts/bench_operator.py.

In the operator's process, kmock took most of the GIL (matching requests, scanning objects), so
the benchmark measured the mock. Here it gets its own interpreter on a loopback port. Besides
the Kubernetes API it answers two bench-only paths, computed here so that the operator's process
does not pay for walking the objects:

- ``GET /_bench/counts``: ``{"children": {instance: n}, "generations": {name: observedGeneration},
  "watched": [plural, ...]}`` (what the operator has started watching);
- ``GET /_bench/wait?name=N&children=C&timeout=T``: returns once instance N has C children
  (or T seconds passed) with ``{"children": n}``; it re-counts after each write, not by polling;
  with ``generation=G`` instead of ``children``, once N's status.observedGeneration is G;
- ``GET /_bench/requests``: ``{"total": n, "watches": w, "by": {"METHOD plural": n}}``, the
  Kubernetes API requests served so far (not these paths), how many were watches, and all of
  them by method and resource.

Object requests (list, watch, get, create, patch, delete of a resource) go to the emulator's
own methods through one reaction tried first, not through kmock's match of every reaction.
The cyclic garbage collector runs with the operator's thresholds (`pdx.controller.collector`):
kmock keeps every object's history, and Python's default thresholds made full collections
of that heap a tenth of the mock's CPU; the bench's runs are minutes, so none runs by count.

Prints ``URL <server url>`` on stdout once listening; exits when stdin closes (the parent ended).
``--cpu N`` pins the server to CPU N (the bench keeps the operator off it).

    .venv/bin/python scripts/kmock_server.py [--cpu 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import gc
import itertools
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.operator.conftest import CHILD_RESOURCES, CR, ApiServer, declare

INSTANCE_LABEL = "app.kubernetes.io/instance"
WRITES = (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE)
# pdx.controller.collector.THRESHOLDS, written out: the baseline leg's pdx (PYTHONPATH) has none.
GC_THRESHOLDS = (50_000, 20, 1_000_000)


_handling: contextvars.ContextVar[kmock.Request | None] = contextvars.ContextVar("handling", default=None)


class RequestLog:
    """The request log kmock matches against, as seen by each request: that request alone.

    kmock finds a request's reactions by re-filtering its whole request log for that very
    request, so each request costs O(log length); even a 64-entry log made the mock spend
    ~45 ms per request, 5x the operator's CPU per resource. The bench never inspects past
    requests, and aiohttp handles each request in its own task (its own context), so the log
    each request's matching iterates holds just that request."""

    def __init__(self) -> None:
        self._seen = 0

    def append(self, request: kmock.Request) -> None:
        self._seen += 1
        _handling.set(request)

    def __iter__(self) -> Iterator[kmock.Request]:
        request = _handling.get()
        return iter(() if request is None else (request,))

    def __len__(self) -> int:
        return self._seen  # kmock numbers requests by it


@attrs.define(kw_only=True)
class BenchApiServer(ApiServer):
    """ApiServer plus the bench's read-outs, answered before kmock's request matching."""

    _changed: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)  # replaced per write
    _child_res: frozenset[kmock.resource] = attrs.field(factory=lambda: frozenset(CHILD_RESOURCES.values()), init=False)
    _watched: set[str] = attrs.field(factory=set, init=False)

    _served: int = attrs.field(default=0, init=False)
    _by: dict[str, int] = attrs.field(factory=dict, init=False)  # "METHOD plural[/sub]" -> requests
    _watches: int = attrs.field(default=0, init=False)

    _index: dict[kmock.resource, dict[tuple[Any, str | None, str], None]] = attrs.field(factory=dict, init=False)
    _indexed: int = attrs.field(default=0, init=False)

    # The read-outs, kept per write (the bench polls them every 0.25 s; walking every object
    # for each poll cost the mock a tenth of its CPU at 300 resources, more at 2000).
    _kids: dict[str, set[tuple[Any, str | None, str]]] = attrs.field(factory=dict, init=False)  # instance -> keys
    _owner: dict[tuple[Any, str | None, str], str] = attrs.field(factory=dict, init=False)  # key -> instance
    _gens: dict[str, int] = attrs.field(factory=dict, init=False)  # CR name -> status.observedGeneration

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._requests = RequestLog()  # type: ignore[assignment]
        # One reaction, tried first, hands each object request to the emulator's method for its
        # action: kmock tries its reactions in priority order (the emulator's six at the lowest,
        # after its discovery ones), matching each one's filter generically, which was a quarter
        # of the mock's CPU. The methods are those kmock would pick, so the answers are the same.
        serve = {
            kmock.action.LIST: self._serve_list,
            kmock.action.WATCH: self._serve_watch,
            kmock.action.FETCH: self._serve_fetch,
            kmock.action.CREATE: self._serve_create,
            kmock.action.UPDATE: self._serve_update,
            kmock.action.DELETE: self._serve_delete,
        }

        def objects(request: kmock.Request) -> bool:
            return request.resource is not None and bool(request.resource.plural) and request.action in serve

        (self**1)[objects] << (lambda request: serve[request.action](request))

    def _by_resource(self) -> dict[kmock.resource, dict[tuple[Any, str | None, str], None]]:
        """Object keys per resource. kmock finds a request's objects (and, for lists, the known
        resources) by comparing every stored object: O(all objects) per request, which at 500
        CRs (6000 children) made the mock the bottleneck. kmock never drops a key (deletes are
        soft), so new keys are at the end of its insertion-ordered store."""
        if len(self.objects) != self._indexed:
            for key in itertools.islice(self.objects.keys(), self._indexed, None):
                self._index.setdefault(key[0], {})[key] = None  # ordered, as kmock lists
            self._indexed = len(self.objects)
        return self._index

    def _get_resources(self) -> list[kmock.resource]:
        return list({*kmock.KubernetesScaffold._get_resources(self), *self._by_resource()})

    def _KubernetesEmulator__get_objs(self, request: kmock.Request, strict: bool) -> list[Any]:
        """kmock's object lookup (a private method), by index instead of a scan; same rules:
        strict needs the namespace as given, else no namespace means all namespaces."""
        store = self.objects._objects  # the key -> Object dict; an object may be replaced
        if request.resource is None:
            return []
        if request.name is not None and (strict or request.namespace is not None):
            obj = store.get((request.resource, request.namespace, request.name))
            return [] if obj is None else [obj]
        return [
            store[key]
            for key in self._by_resource().get(request.resource, {})
            if (key[1] == request.namespace or (not strict and request.namespace is None))
            and (request.name is None or key[2] == request.name)
        ]

    async def _handle(self, request: kmock.Request) -> Any:
        path = request.url.path
        if path == "/_bench/counts":
            kids, gens = self.counts()
            return aiohttp.web.json_response({"children": kids, "generations": gens, "watched": sorted(self._watched)})
        if path == "/_bench/wait":
            if "generation" in request.params:
                return aiohttp.web.json_response({"generation": await self._wait_generation(request)})
            return aiohttp.web.json_response({"children": await self._wait(request)})
        if path == "/_bench/requests":
            return aiohttp.web.json_response({"total": self._served, "watches": self._watches, "by": self._by})
        self._served += 1
        method = getattr(request.method, "value", request.method)
        what = f"{method} {request.resource.plural if request.resource else path}"
        what += f"/{request.subresource}" if request.subresource else ""
        self._by[what] = self._by.get(what, 0) + 1
        if request.resource is not None and request.resource.plural and request.action == kmock.action.WATCH:
            self._watched.add(request.resource.plural)
            self._watches += 1
        try:
            return await super()._handle(request)
        finally:
            if request.resource is not None and request.action in WRITES:
                self._tally(request)
                self._changed.set()
                self._changed = asyncio.Event()

    def _tally(self, request: kmock.Request) -> None:
        """The counts after one write, from the one object it wrote."""
        meta = (request.data.get("metadata") or {}) if isinstance(request.data, dict) else {}
        key = (request.resource, request.namespace or meta.get("namespace"), request.name or meta.get("name") or "")
        obj = self.objects._objects.get(key)
        gone = obj is None or obj.deleted
        if request.resource == CR:
            gen = None if gone else (obj.raw.get("status") or {}).get("observedGeneration")
            if isinstance(gen, int):
                self._gens[key[2]] = gen
            else:
                self._gens.pop(key[2], None)
        elif request.resource in self._child_res:
            if (was := self._owner.pop(key, None)) is not None:
                self._kids.get(was, set()).discard(key)
            if not gone:
                inst = ((obj.raw.get("metadata") or {}).get("labels") or {}).get(INSTANCE_LABEL)
                if isinstance(inst, str):
                    self._owner[key] = inst
                    self._kids.setdefault(inst, set()).add(key)

    async def _wait(self, request: kmock.Request) -> int:
        """Children of instance `name` once there are `children` of them or `timeout` passed."""
        name = request.params["name"]
        want = int(request.params.get("children", "1"))
        end = time.monotonic() + float(request.params.get("timeout", "60"))
        while (n := self.counts()[0].get(name, 0)) < want and (left := end - time.monotonic()) > 0:
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)
        return n

    async def _wait_generation(self, request: kmock.Request) -> int | None:
        """status.observedGeneration of CR `name` once it is `generation` or `timeout` passed;
        one look-up per write, not a walk over all objects."""
        key = (CR, request.params.get("namespace", "inference"), request.params["name"])
        want = int(request.params["generation"])
        end = time.monotonic() + float(request.params.get("timeout", "60"))

        def seen() -> int | None:
            obj = self.objects._objects.get(key)
            gen = None if obj is None or obj.deleted else (obj.raw.get("status") or {}).get("observedGeneration")
            return gen if isinstance(gen, int) else None

        while ((gen := seen()) is None or gen < want) and (left := end - time.monotonic()) > 0:
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)
        return gen

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Live children per instance label, and status.observedGeneration per CR name."""
        return {inst: len(keys) for inst, keys in self._kids.items() if keys}, dict(self._gens)


async def _stdin_closed() -> None:
    """Wait for EOF on stdin, so the server never outlives the bench that started it."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.buffer.read)


async def serve() -> None:
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # per-request lines are cost
    async with BenchApiServer() as api, kmock.Server(api):
        declare(api)
        os.write(1, f"URL {str(api.url).rstrip('/')}\n".encode())
        await _stdin_closed()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", type=int, help="run on this CPU only")
    args = p.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})  # before any thread starts: they inherit it
    gc.set_threshold(*GC_THRESHOLDS)
    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
