"""One task for the whole operator that starts the passes of child events and periodic passes.

Why not a kopf daemon per resource (as before): a daemon makes kopf put its finalizer on every
CR (kopf blocks deletion until it has stopped the daemons), which costs a PATCH of each new CR
and one more watch event that kopf processes in full, and kopf skips the creation handler on
the event where it adds the finalizer, so the first pass waited for that echo. The children
need no finalizer (ownerReferences), and the handlers need none either: without a daemon no CR
carries one, and a deleted CR is gone at once.

The worker keeps, per resource kopf handed to the handlers, when its next periodic pass is due
(RESYNC seconds after the first pass, then after the end of each periodic one), and the
resources woken by child events. It only starts passes (`run(key, periodic)`, a coroutine of
the handlers'); serializing the passes of one resource and bounding those of all is `_pass`'s
and the pool's. A resource whose CR has left kopf's index is forgotten (`forget`).

Peering: kopf stops daemons while it pauses a replica in favour of another; the worker stops
too. It reads kopf's own pause switches (the ToggleSet kopf hands its daemon killer: kopf has
no public accessor for them, see `capture_kopf_pause`), starts nothing while they are on, and
after a pause waits for the first CR event of kopf's relisting (`relisted`), so it acts on the
fresh CR state, as the respawned daemons did.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)


class _Pause:
    """The pause switches of the kopf operator running in this process (None before one runs)."""

    toggles: Any = None


PAUSE = _Pause()


def capture_kopf_pause() -> bool:
    """Wrap kopf's daemon killer, the one root task kopf hands its pause switches, so the
    worker sees them. kopf creates that task before it runs the startup handlers, each run anew.
    False when kopf has no such function any more (the handlers then refuse to start)."""
    try:
        from kopf._core.engines import daemons
    except ImportError:
        return False
    real = getattr(daemons, "daemon_killer", None)
    if real is None:
        return False
    if getattr(real, "_pdx_captures", False):
        return True

    def daemon_killer(**kwargs: Any) -> Any:
        PAUSE.toggles = kwargs.get("operator_paused")
        return real(**kwargs)

    daemon_killer._pdx_captures = True  # type: ignore[attr-defined]
    daemons.daemon_killer = daemon_killer
    return True


def paused() -> bool:
    toggles = PAUSE.toggles
    return bool(toggles is not None and toggles.is_on())


@dataclass
class Worker:
    run: Callable[[Key, bool], Awaitable[None]]  # one pass (periodic: with the router's counters)
    present: Callable[[Key], bool]  # whether the CR is in kopf's index
    forget: Callable[[Key], None]  # drop everything kept for a deleted CR
    resync: float
    _due: list[tuple[float, Key]] = field(default_factory=list)  # a heap; stale entries skipped
    _when: dict[Key, float] = field(default_factory=dict)  # each resource's one live due time
    _woken: set[Key] = field(default_factory=set)
    _kick: asyncio.Event = field(default_factory=asyncio.Event)
    relisted: asyncio.Event = field(default_factory=asyncio.Event)  # set on every CR event
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _main: asyncio.Task[None] | None = None

    def adopt(self, key: Key) -> None:
        """A resource kopf handed over (create, update, resume): periodic passes from now on."""
        if key not in self._when:
            self._schedule(key, asyncio.get_running_loop().time() + self.resync)

    def wake(self, key: Key) -> None:
        """A child event: a pass soon (on the event loop, as the feeds call it)."""
        self._woken.add(key)
        self._kick.set()

    def known(self, key: Key) -> bool:
        return key in self._when

    def drop(self, key: Key) -> None:
        self._when.pop(key, None)
        self._woken.discard(key)

    def _schedule(self, key: Key, when: float) -> None:
        self._when[key] = when
        heapq.heappush(self._due, (when, key))
        self._kick.set()

    def start(self) -> None:
        self._main = asyncio.get_running_loop().create_task(self._loop(), name="pdx-worker")

    async def stop(self) -> None:
        tasks = [t for t in (self._main, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if paused():
                log.info("kopf paused this replica; no passes until it resumes")
                while paused():
                    await PAUSE.toggles.wait_for(False)
                self.relisted.clear()
                await self.relisted.wait()  # kopf relists the CRs after a pause: act on that
                log.info("resumed; passes again")
                continue
            now = loop.time()
            woken, self._woken = self._woken, set()
            while self._due and self._due[0][0] <= now:
                when, key = heapq.heappop(self._due)
                if self._when.get(key) == when:
                    del self._when[key]  # rescheduled when its pass ends
                    woken.discard(key)  # the periodic pass serves the child event too
                    self._spawn(key, True)
            for key in woken:
                self._spawn(key, False)
            self._kick.clear()
            left = self._due[0][0] - now if self._due else None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._kick.wait()
            # A pause that began meanwhile is seen at the top of the loop, before anything starts.

    def _spawn(self, key: Key, periodic: bool) -> None:
        task = asyncio.get_running_loop().create_task(self._one(key, periodic), name=f"pdx-pass-{key[0]}/{key[1]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _one(self, key: Key, periodic: bool) -> None:
        try:
            await self.run(key, periodic)
        except asyncio.CancelledError:
            raise
        except Exception:  # a pass's failure must not end the worker; the next trigger tries again
            log.exception("pass of %s/%s failed", *key)
        if not self.present(key):
            self.drop(key)
            self.forget(key)
        elif periodic and key not in self._when:
            self._schedule(key, asyncio.get_running_loop().time() + self.resync)


__all__ = ["PAUSE", "Worker", "capture_kopf_pause", "paused"]
