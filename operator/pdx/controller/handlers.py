"""kopf registrations, nothing else: every trigger runs the same reconcile pass.

Run: `kopf run -m pdx.controller.handlers --all-namespaces` (see docs/operator.md).

State: the pass reads the CR, its children and pods from memory, not from the API. kopf
watches the CR into one `@kopf.index`; the child kinds and pods come from the operator's own
list+watch streams (`feed.Feeds`, one per kind: kopf's per-event machinery cost more than the
pass for the ~13 child events of each new resource), filed under (namespace, instance);
`state.WatchState` takes a snapshot from both plus the API's answers to the operator's own
writes not yet echoed by a watch. The startup handler waits for every feed's first listing,
and kopf runs no resource handler before its CR index has its own, so a (re)started operator
acts only on complete state. A pass with nothing to do sends no request, and one whose
snapshot is the same as that of the last pass that found nothing to do is skipped without
rendering.

Triggers: create/update/resume of a DisaggregatedInference, a periodic pass (drift repair of
any child kind, router reuse counters; from the same state, so a safety net, not a re-read),
and events of the StatefulSets and Deployments the operator owns (a deleted or hand-edited
engine set comes back at once; pod readiness reaches the router's endpoints file through the
sets' status): the feed wakes the operator's one worker (`worker.Worker`), which also runs each
resource's periodic pass and starts nothing while kopf's peering pauses this replica, so a
standby acts on nothing (no kopf daemon per CR: it made kopf put a finalizer on every CR).
Passes for one resource never overlap: a trigger arriving while a pass runs marks the resource
dirty and the running pass goes once more (from a new snapshot), so bursts of child events
collapse into one or two passes. Passes of different resources run in parallel on a pool of
PDX_WORKERS threads (the bound). The watch echo of the operator's own apply (same
resourceVersion as the apply's answer) triggers nothing: the pass that wrote it already saw
that state.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import logging
import os
import secrets
import threading
import time
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import click
import kopf

from pdx import kinds, labels, rules
from pdx.controller import collector, kopfjson, metrics
from pdx.controller.bookkeeping import MemoryDiffBaseStorage, MemoryProgressStorage
from pdx.controller.feed import Feeds, Notify
from pdx.controller.kube import ApiError, EventSource, Kube, make_api_client
from pdx.controller.rbac import PEERING_NAME
from pdx.controller.reconcile import Outcome, load_target, pod_view, reconcile_snapshot
from pdx.controller.routerstats import StatsCache
from pdx.controller.state import ListReads, Snapshot, WatchState, index_id
from pdx.controller.worker import Worker, capture_kopf_pause
from pdx.render.meta import router_url
from pdx.resource import SpecError
from pdx.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)

RESYNC_SECONDS = float(os.environ.get("PDX_RESYNC_SECONDS", "30"))
WORKERS = int(os.environ.get("PDX_WORKERS", "8"))  # passes in flight at once, over all resources
# One periodic pass per this many seconds, over all resources, reads its resource from the API
# instead (see `_work`): O(1) requests per interval however many resources there are.
AUDIT_SECONDS = float(os.environ.get("PDX_AUDIT_SECONDS", str(RESYNC_SECONDS)))
STATS_TIMEOUT_SECONDS = 2.0
RETRY_DELAY_SECONDS = 10


def fetch_router_stats(base_url: str) -> Mapping[str, Any] | None:
    """GET /v1/pdx/stats with a short timeout; the periodic check tolerates any failure."""
    with urllib.request.urlopen(f"{base_url}/v1/pdx/stats", timeout=STATS_TIMEOUT_SECONDS) as resp:
        data = json.loads(resp.read())
    return data if isinstance(data, dict) else None


@dataclass
class _Gate:
    """Per resource, touched on kopf's event loop only (the tests read `written` directly)."""

    running: bool = False
    dirty: bool = False
    # (kind, name) -> resourceVersion of the last apply of that child (see `_is_echo`).
    written: dict[tuple[str, str], str] = field(default_factory=dict)
    # The snapshot (and router stats) of the last pass that found nothing to do.
    quiet: tuple[Any, ...] | None = None
    # A periodic pass asked for while a pass ran: the running one goes once more, with stats.
    stats: bool = False
    # The CR's uid as kopf last handed it over (kopf's bookkeeping in memory is kept by uid).
    uid: str | None = None
    # Child events that arrived during a pass, as ((kind, name), resourceVersion): most are
    # echoes of that very pass's applies, which it records only when it returns.
    pending: list[tuple[tuple[str, str], str]] = field(default_factory=list)
    # Set while the resource's pass waits for a pool thread (see `_Slots.promote`).
    waiting: asyncio.Future[None] | None = None


_gates: dict[tuple[str, str], _Gate] = {}
_gates_lock = threading.Lock()
# The operator's one worker (child events, periodic passes); set by the startup handler.
_worker: Worker | None = None
_PAUSE_CAPTURED = capture_kopf_pause()


def _gate(key: tuple[str, str]) -> _Gate:
    with _gates_lock:
        return _gates.setdefault(key, _Gate())


def _post(memo: Any, outcome: Outcome) -> None:
    """The pass's Events, from its own thread over its own connection (best effort, as kopf's
    poster: a failure is logged and changes nothing). kopf's poster cost its event loop a
    queue hop, a task per object and an aiohttp request for each Event."""
    source: EventSource = getattr(memo, "event_source", None) or EventSource()
    for ev in outcome.events:
        try:
            _kube(memo).post_event(outcome.body, ev.type, ev.reason, ev.message[:1000], source)
        except ApiError as err:
            log.warning(
                "posting the event %s of %s failed: %s", ev.reason, outcome.body.get("metadata", {}).get("name"), err
            )


def _kube(memo: Any) -> Kube:
    kube: Kube | None = getattr(memo, "kube", None)
    if kube is None:
        kube = memo.kube = Kube(make_api_client())
    return kube


def _state(memo: Any) -> WatchState:
    state: WatchState | None = getattr(memo, "state", None)
    if state is None:
        state = memo.state = WatchState()
    return state


# What a pass waiting for a pool thread is for, most urgent first: a spec not yet acted on
# (a new resource, an edit), then child events, then periodic passes. On a busy API server a
# pass takes seconds (13 applies, one after the other); in first-come order an edit waited
# behind every pass the real controllers' status updates had triggered.
SPEC, CHILD, PERIODIC = 0, 1, 2


class _Slots:
    """The pool's threads as slots, taken by priority then arrival (on kopf's event loop only).
    At most `size` passes are in the pool, so its own first-come queue never fills."""

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    async def take(self, priority: int, gate: _Gate | None = None) -> bool:
        """A slot; while waiting, `gate.waiting` lets a later trigger `promote` this pass.
        True if it waited (others ran meanwhile), False if it took a free one at once."""
        if self.free > 0 and not self._waiting:
            self.free -= 1
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._arrivals), fut))
        if gate is not None:
            gate.waiting = fut
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.give()  # handed a slot just as it was cancelled: pass it on
            raise
        finally:
            if gate is not None:
                gate.waiting = None
        return True

    def promote(self, fut: asyncio.Future[None], priority: int) -> None:
        """A waiting pass goes up to `priority` (its old entry is skipped once `fut` is done)."""
        if not fut.done():
            heapq.heappush(self._waiting, (priority, next(self._arrivals), fut))

    def give(self) -> None:
        while self._waiting:
            fut = heapq.heappop(self._waiting)[2]
            if not fut.done():
                fut.set_result(None)
                return
        self.free += 1


def _slots(memo: Any) -> _Slots:
    slots: _Slots | None = getattr(memo, "slots", None)
    if slots is None:
        slots = memo.slots = _Slots(WORKERS)
    return slots


def _priority(snap: Snapshot, periodic: bool) -> int:
    meta = snap.body.get("metadata") or {}
    observed = (snap.body.get("status") or {}).get("observedGeneration")
    if meta.get("generation") is not None and observed != meta.get("generation"):
        return SPEC
    return PERIODIC if periodic else CHILD


def _pool(memo: Any) -> ThreadPoolExecutor:
    pool: ThreadPoolExecutor | None = getattr(memo, "pool", None)
    if pool is None:
        pool = memo.pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="pdx-pass")
    return pool


def _router_url(snap: Snapshot, namespace: str) -> str | None:
    """Where to ask for the router's counters; None while none of its pods is ready. Such a
    router cannot answer, and at fleet scale every periodic pass would still spend a name
    lookup and a connection on it (2000 resources converging without routers: one in every
    30 s each, ~0.23 ms of the operator's CPU apiece, and a lookup for the cluster's DNS)."""
    if not any((view := pod_view(p)).role == "router" and view.serving for p in snap.pods):
        return None
    try:
        return router_url(load_target(snap.body, namespace))
    except SpecError:
        return None


def _stats(memo: Any) -> StatsCache:
    """The routers' counters, fetched beside the passes (routerstats.py says why). A fetch that
    brings new counters wakes its resource through the worker, on the event loop."""
    cache: StatsCache | None = getattr(memo, "stats", None)
    if cache is None:
        loop = asyncio.get_running_loop()

        def on_new(key: tuple[str, str]) -> None:
            if _worker is not None:
                loop.call_soon_threadsafe(_worker.wake, key)

        cache = memo.stats = StatsCache(getattr(memo, "fetch_stats", fetch_router_stats), on_new)
    return cache


@dataclass
class _Audit:
    """When the next audit is due, one for the operator: kopf hands each resource a shallow
    copy of the memo, so this lives in a shared object, not in a memo attribute."""

    due: float = 0.0


def _audit_due(memo: Any) -> bool:
    """Whether this periodic pass is the audit of its interval (on the event loop: no lock)."""
    audit: _Audit | None = getattr(memo, "audit", None)
    if audit is None:
        audit = memo.audit = _Audit()
    now = time.monotonic()
    if now < audit.due:
        return False
    audit.due = now + AUDIT_SECONDS
    return True


def _work(
    memo: Any, gate: _Gate, namespace: str, name: str, snap: Snapshot, stats: bool, audit: bool
) -> Outcome | None:
    """In a pool thread: the pass, unless its inputs equal those of the last idle one.

    An audit pass lists its resource from the API and reconciles from that: a watch that
    lost events (kopf relists on reconnect but never drops what the new listing lacks) shows
    up as a difference, is logged, and that resource is repaired at once. Watches fail for
    all resources alike, so auditing one resource per interval finds a broken feed quickly.
    """
    cache: StatsCache | None = getattr(memo, "stats", None)  # None: a pass run outside the operator
    if cache is not None and stats and (url := _router_url(snap, namespace)) is not None:
        cache.refresh((namespace, name), url)  # its answer, if new, wakes this resource again
    fetched = cache.latest((namespace, name)) if cache is not None else None
    inputs = (snap.fingerprint(), json.dumps(fetched, sort_keys=True, default=str))
    if audit:
        listed = ListReads(_kube(memo)).read(namespace, name)
        if listed is None:
            return None
        if (differs := _differences(snap, listed)) and not listed.body.get("metadata", {}).get("deletionTimestamp"):
            log.info("watch-fed state of %s/%s differs from the API (%s); reconciling from the API", namespace, name,
                     ", ".join(differs))  # fmt: skip
        snap = listed
    elif inputs == gate.quiet:
        return None
    t0 = time.perf_counter()
    try:
        outcome = reconcile_snapshot(
            _kube(memo), namespace, name, snap, fetch_stats=(lambda _url: fetched) if fetched is not None else None
        )
    except ApiError:
        metrics.failed("api")
        metrics.passed("failed", time.perf_counter() - t0)
        raise
    metrics.passed(_result(outcome), time.perf_counter() - t0)
    if outcome.error:
        metrics.failed("apply")
    _post(memo, outcome)
    idle = not outcome.writes and not outcome.events and not outcome.error
    gate.quiet = inputs if idle and not audit else None
    return outcome


def _differences(watched: Snapshot, listed: Snapshot) -> list[str]:
    """Objects the watches have in another version than the API, or not at all (or extra).
    A write racing the audit shows up here too; the pass from the listing is right either way."""

    def versions(snap: Snapshot) -> dict[tuple[str, str], str]:
        out = {k: str(o["metadata"].get("resourceVersion")) for k, o in snap.children.items()}
        out.update({("Pod", p["metadata"]["name"]): str(p["metadata"].get("resourceVersion")) for p in snap.pods})
        return out

    a, b = versions(watched), versions(listed)
    return [f"{k}/{n}" for k, n in sorted(a.keys() | b.keys()) if a.get((k, n)) != b.get((k, n))]


async def _pass(
    memo: Any,
    indices: Mapping[str, Any],
    namespace: str,
    name: str,
    *,
    stats: bool,
    logger: Any,
    handoff: bool = False,
) -> Outcome | None:
    """Passes for one resource one at a time: a trigger during a pass only marks it dirty.

    `handoff` (kopf's handlers): a pass made dirty meanwhile goes again from the worker, and
    this returns. kopf handles a resource's next event (an edit) only once its handler has
    returned, and with the real controllers updating the StatefulSets' status while pods
    come, a handler that looped until nothing came in returned minutes late."""
    gate = _gate((namespace, name))
    if gate.running:
        gate.dirty = True
        gate.stats = gate.stats or stats  # a periodic pass: the running one goes again with stats
        if handoff and gate.waiting is not None:
            _slots(memo).promote(gate.waiting, SPEC)  # an edit while a pass of a child event waits
        return None
    gate.running = True
    state = _state(memo)
    loop = asyncio.get_running_loop()
    try:
        while True:
            gate.dirty = False
            stats, gate.stats = stats or gate.stats, False
            snap = state.read_from(_indices(memo, indices), namespace, name)
            if snap is None:
                return None
            slots = _slots(memo)
            waited = await slots.take(_priority(snap, stats), gate)
            try:
                # The state may have moved while this pass waited for a slot: a fresh snapshot
                # holds whatever came meanwhile, so those triggers need no pass of their own.
                # A slot taken at once let nothing else run: the snapshot above is current.
                if waited:
                    gate.dirty = False
                    gate.pending.clear()
                    stats, gate.stats = stats or gate.stats, False
                    snap = state.read_from(_indices(memo, indices), namespace, name)
                    if snap is None:
                        return None
                audit = stats and _audit_due(memo)
                outcome = await loop.run_in_executor(
                    _pool(memo), _work, memo, gate, namespace, name, snap, stats, audit
                )
            finally:
                slots.give()
            stats = False
            if outcome is not None:  # every pass reports its own actions, also the coalesced ones
                gate.written.update(outcome.versions)
            if any(gate.written.get(key) != version for key, version in gate.pending):
                gate.dirty = True  # someone else's change came in meanwhile
            gate.pending.clear()
            if outcome is not None:
                state.record(namespace, name, outcome.answers, outcome.deleted)
                if outcome.writes:
                    logger.info(
                        "reconciled %s/%s: applied %s, pruned %s, status %s",
                        namespace,
                        name,
                        outcome.applied or "-",
                        outcome.pruned or "-",
                        sorted(outcome.status) or "-",
                    )
            if not gate.dirty:
                return outcome
            if handoff and _worker is not None:
                _worker.wake((namespace, name))
                return outcome
    finally:
        gate.running = False


def _indices(memo: Any, kw: Mapping[str, Any]) -> Mapping[str, Any]:
    """The CR index kopf passes to handlers, with the feeds' stores under their index ids."""
    views: dict[str, Any] = memo.views
    return {**views, _CR_INDEX: kw[_CR_INDEX]}


def _result(outcome: Outcome | None) -> str:
    if outcome is None:
        return "gone"
    if outcome.error:
        return "failed"
    if outcome.invalid:
        return "invalid"
    return "wrote" if outcome.writes else "idle"


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **kw: Any) -> None:
    """Peering for two replicas, pdx-prefixed kopf bookkeeping, the API client, and the
    feeds: kopf starts watching the CR after its startup handlers, so returning only once
    every feed has its first listing means no pass ever sees a partial state."""
    settings.peering.name = PEERING_NAME
    settings.peering.mandatory = os.environ.get("PDX_PEERING_MANDATORY", "") == "1"
    # kopf peering freezes every replica on a priority tie, so each replica draws its own
    # priority (a Deployment gives them all one env): the highest serves, the rest stand by.
    if os.environ.get("PDX_OPERATOR_PRIORITY"):
        settings.peering.priority = int(os.environ["PDX_OPERATOR_PRIORITY"])
    elif settings.peering.priority == 0:
        settings.peering.priority = 1 + secrets.randbelow(2**30)
    # In memory: a PATCH of the CR and a watch event less per handled change, and the
    # `kopf-managed` marker never written (bookkeeping.py says why that is safe here).
    settings.persistence.progress_storage = memo.progress = MemoryProgressStorage(prefix=labels.KOPF_PREFIX)
    settings.persistence.diffbase_storage = memo.diffbase = MemoryDiffBaseStorage()
    settings.persistence.finalizer = labels.FINALIZER
    # Only with settings.posting.loggers (off by default since kopf 1.40) would handler log
    # lines become Events; the operator's own (Applied, Ready, ...) go through kopf.event.
    settings.posting.level = logging.INFO
    settings.execution.max_workers = WORKERS  # the few sync handlers left (startup, deletion)
    if not _PAUSE_CAPTURED:
        raise kopf.PermanentError("this kopf has no daemon_killer to read its pause switches from; pdx needs kopf 1.45")
    # The pass threads post the Events themselves, as kopf's poster would have.
    memo.event_source = EventSource(
        component=settings.posting.reporting_component,
        instance=settings.posting.reporting_instance,
        name_prefix=settings.posting.event_name_prefix,
    )
    if getattr(memo, "kube", None) is None:
        memo.kube = Kube(make_api_client())
    # Let urllib3 keep a connection per pass thread instead of reconnecting.
    memo.kube.api.rest_client.pool_manager.connection_pool_kw["maxsize"] = max(WORKERS, 4)
    _state(memo)
    _pool(memo)
    _slots(memo)  # here, on the memo kopf copies for each handler call: one set of slots for all
    _stats(memo)  # on the event loop: its fetches wake resources through the worker
    with _gates_lock:
        _gates.clear()  # a new run (tests restart in one process): no pass of ours wrote anything yet
    rules.warm_up()
    kopfjson.install()  # before kopf starts watching the CRs, which it does after the startup handlers
    if getattr(memo, "metrics_port", None) is None:
        memo.metrics_port = metrics.serve()
    # The API server filters the feeds by label: the operator never receives the cluster's
    # other pods, ConfigMaps, Services...
    selectors = {k: sel for k in (*kinds.CHILDREN, kinds.POD) if (sel := _watch_labels(k)) is not None}
    memo.feeds = feeds = Feeds.build(memo.kube.api.configuration, selectors, _served_namespaces(), _notify)
    memo.views = {index_id(k): feeds.view(k) for k in selectors}
    feeds.start()
    await feeds.listed()
    logger.info("listed %s; watching them", ", ".join(k.plural for k in selectors))
    memo.audit = _Audit(due=time.monotonic() + AUDIT_SECONDS)  # the state was just listed
    global _worker
    _worker = _make_worker(memo, kw[_CR_INDEX])
    _worker.start()
    collector.tune()  # the state is a large long-lived heap: no full collections by count
    memo.collecting = asyncio.get_running_loop().create_task(collector.collect_periodically(), name="pdx-gc")


def _make_worker(memo: Any, cr_index: Any) -> Worker:
    """The worker runs `_pass` (looked up at each call: tests wrap it) from the root memo."""
    indices = {_CR_INDEX: cr_index}

    async def run(key: tuple[str, str], periodic: bool) -> None:
        try:
            await _pass(memo, indices, key[0], key[1], stats=periodic, logger=log)
        except ApiError as err:
            what = "periodic reconcile" if periodic else "reconcile after a child event"
            log.warning("%s of %s/%s failed: %s", what, key[0], key[1], err)

    return Worker(
        run=run,
        present=lambda key: bool(list(cr_index.get(key, ()))),
        forget=lambda key: _forget(memo, key),
        resync=RESYNC_SECONDS,
    )


def _forget(memo: Any, key: tuple[str, str], uid: str | None = None) -> None:
    """Everything kept for a deleted CR: its gate, its writes not yet echoed, kopf's bookkeeping."""
    with _gates_lock:
        gate = _gates.pop(key, None)
    if gate is not None and gate.running:
        with _gates_lock:
            _gates[key] = gate  # a pass still runs; the next trigger finds the CR gone again
        return
    _state(memo).forget(*key)
    if (cache := getattr(memo, "stats", None)) is not None:
        cache.forget(key)
    _forget_bookkeeping(memo, uid, gate.uid if gate is not None else None)


def _forget_bookkeeping(memo: Any, *uids: str | None) -> None:
    """kopf's in-memory diff base and progress of these CR uids (kept by uid, not by name)."""
    for kept in (getattr(memo, "diffbase", None), getattr(memo, "progress", None)):
        for uid in set(uids) - {None}:
            if kept is not None:
                kept.forget(uid)


def _served_namespaces() -> list[str] | None:
    """The namespaces kopf was started for (`--namespace`, given once per namespace), None
    for all: with a Role per namespace, a cluster-wide watch would be refused. kopf's own
    command line is the one source; run without it (`kopf.run()`), the feeds watch all."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or ctx.params.get("clusterwide"):
        return None
    given = [*(ctx.params.get("namespaces") or ()), *filter(None, [os.environ.get("KOPF_RUN_NAMESPACE")])]
    if patterns := [n for n in given if any(c in n for c in "*?[!,")]:
        raise kopf.PermanentError(f"--namespace {patterns}: pdx serves named namespaces, not patterns; name each")
    return given or None


@kopf.on.cleanup()
async def stop_pool(memo: kopf.Memo, **_: Any) -> None:
    global _worker
    if _worker is not None:
        await _worker.stop()
        _worker = None
    collecting: asyncio.Task[None] | None = getattr(memo, "collecting", None)
    if collecting is not None:
        collecting.cancel()
    pool: ThreadPoolExecutor | None = getattr(memo, "pool", None)
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
    cache: StatsCache | None = getattr(memo, "stats", None)
    if cache is not None:
        cache.close()
        memo.stats = None  # its wake-ups are bound to this run's event loop
    feeds: Feeds | None = getattr(memo, "feeds", None)
    if feeds is not None:
        await feeds.stop()


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def converge(namespace: str | None, name: str, memo: Any, logger: Any, uid: str | None, **kw: Any) -> None:
    assert namespace is not None  # the resource is namespaced
    key = (namespace, name)
    gate = _gate(key)
    if gate.uid != uid:
        _forget_bookkeeping(memo, gate.uid)  # deleted and created again under the same name
        gate.uid = uid
    if _worker is not None:
        _worker.adopt(key)  # periodic passes from now on
    try:
        outcome = await _pass(memo, kw, namespace, name, stats=False, logger=logger, handoff=True)
    except ApiError as err:
        raise kopf.TemporaryError(str(err), delay=RETRY_DELAY_SECONDS) from err
    if outcome is not None and outcome.error:
        raise kopf.TemporaryError(outcome.error, delay=RETRY_DELAY_SECONDS)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
async def deleted(namespace: str | None, name: str, memo: Any, logger: Any, uid: str | None, **_: Any) -> None:
    """Called only when a CR's deletion waits for someone's finalizer (foreground deletion, say):
    pdx puts none, so most CRs just vanish and the worker forgets them (`worker.Worker._one`).
    Children carry ownerReferences: the garbage collector removes them."""
    key = (namespace or "", name)
    if _worker is not None:
        _worker.drop(key)
    _forget(memo, key, uid)
    logger.info("%s/%s deleted; its children go with it (ownerReferences)", namespace, name)


def _owner(body: Mapping[str, Any]) -> str | None:
    meta = body.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "DisaggregatedInference" and ref.get("controller"):
            name = ref.get("name")
            return name if isinstance(name, str) else None
    return None


def _is_echo(event: Mapping[str, Any], body: Mapping[str, Any], namespace: str, owner: str) -> bool:
    """Whether the event only reports the operator's own last apply of this child.

    Without this, every pass that creates or updates the engine sets and the router caused
    three to six more full passes (ADDED/MODIFIED of each), each reading every child kind.
    A deletion is never an echo; anything written by others carries a newer version.
    """
    if event.get("type") not in ("ADDED", "MODIFIED"):
        return False
    meta = body.get("metadata") or {}
    version = meta.get("resourceVersion")
    with _gates_lock:
        gate = _gates.get((namespace, owner))
    if gate is None or version is None:
        return False
    return bool(gate.written.get((body.get("kind", ""), meta.get("name", ""))) == version)


def _notify(kind: kinds.Kind) -> Notify | None:
    """What a feed calls on each change of its kind: for the kinds that trigger passes."""
    return _child_changed if kind.watched else None


def _child_changed(event_type: str, body: dict[str, Any]) -> None:
    """A watched child changed: a pass of its owner (a deleted or hand-edited set comes back).
    No gate yet means no pass yet: the first one will read this state anyway."""
    owner = _owner(body)
    namespace = (body.get("metadata") or {}).get("namespace")
    if owner is None or not namespace or _is_echo({"type": event_type}, body, namespace, owner):
        return
    with _gates_lock:
        gate = _gates.get((namespace, owner))
    if gate is None:
        return
    meta = body.get("metadata") or {}
    if gate.running and event_type != "DELETED" and meta.get("resourceVersion"):
        gate.pending.append(((str(body.get("kind", "")), str(meta.get("name", ""))), str(meta["resourceVersion"])))
    elif _worker is not None:
        _worker.wake((namespace, owner))


def _index_cr(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """The CR filed under its own (namespace, name). Lightweight, as kopf asks: a shallow copy.
    Every CR event passes here first, kopf's relisting after a pause too (the worker waits for it)."""
    if _worker is not None:
        _worker.relisted.set()
    raw = dict(body)
    raw.setdefault("apiVersion", kinds.RESOURCE.api_version)
    raw.setdefault("kind", kinds.RESOURCE.kind)
    meta = raw.get("metadata") or {}
    return {(meta.get("namespace", ""), meta.get("name", "")): raw}


def _watch_labels(kind: kinds.Kind) -> dict[str, str] | None:
    """What the feed of a kind selects: children by the operator's managed labels; pods
    carry only the app and instance labels; every CR."""
    if kind is kinds.RESOURCE:
        return None
    return labels.managed() if kind in kinds.CHILDREN else {labels.NAME: labels.APP}


_CR_INDEX = index_id(kinds.RESOURCE)
kopf.index(GROUP, VERSION, PLURAL, id=_CR_INDEX)(_index_cr)
