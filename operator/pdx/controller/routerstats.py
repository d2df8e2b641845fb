"""The routers' reuse counters, fetched beside the passes, never inside one.

A pass must not wait on a router. At 2000 resources with no router answering, each periodic
pass spent its pool thread in the stats call (getaddrinfo of the router's Service name took
about 5 s), every pass thread sat there, and each CR edit waited 5 s for one of them. So a
periodic pass only asks for a refresh and reconciles with the counters fetched last; a
refresh that brings different counters wakes its resource (`on_new`), whose next pass writes
them. The fetches have threads of their own, at most one in flight per resource.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
Fetch = Callable[[str], Mapping[str, Any] | None]


class StatsCache:
    """Per resource, the last counters its router answered (a failed fetch keeps them)."""

    def __init__(self, fetch: Fetch, on_new: Callable[[Key], None], threads: int = 4) -> None:
        self._fetch = fetch
        self._on_new = on_new
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pdx-stats")
        self._lock = threading.Lock()
        self._latest: dict[Key, Mapping[str, Any]] = {}
        self._in_flight: set[Key] = set()
        self._known: set[Key] = set()  # asked for and not forgotten since: a late answer is kept

    def latest(self, key: Key) -> Mapping[str, Any] | None:
        with self._lock:
            return self._latest.get(key)

    def pending(self, key: Key) -> bool:
        """Whether a fetch for `key` is still in flight."""
        with self._lock:
            return key in self._in_flight

    def refresh(self, key: Key, url: str) -> bool:
        """Fetch `key`'s counters from `url` in the background; False if one is still in flight."""
        with self._lock:
            if key in self._in_flight:
                return False
            self._in_flight.add(key)
            self._known.add(key)
        try:
            self._pool.submit(self._run, key, url)
        except RuntimeError:  # shut down: the operator is stopping
            with self._lock:
                self._in_flight.discard(key)
            return False
        return True

    def forget(self, key: Key) -> None:
        with self._lock:
            self._latest.pop(key, None)
            self._known.discard(key)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self, key: Key, url: str) -> None:
        try:
            got = self._fetch(url)
        except Exception as err:  # best effort: the router may be starting, gone or unreachable
            log.debug("router stats from %s unavailable: %s", url, err)
            got = None
        with self._lock:
            self._in_flight.discard(key)
            new = got is not None and key in self._known and self._latest.get(key) != got
            if new and got is not None:
                self._latest[key] = got
        if new:
            self._on_new(key)
