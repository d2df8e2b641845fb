"""kopf registrations, nothing else: every trigger runs the same reconcile pass.

Run: `kopf run -m pdx.controller.handlers --all-namespaces` (see docs/operator.md).

Triggers: create/update/resume of a DisaggregatedInference, a periodic timer (drift repair
of any child kind, router reuse counters), and events of the StatefulSets and Deployments
the operator owns (a deleted or hand-edited engine set comes back at once; pod readiness
reaches the router's endpoints file through the sets' status). Passes for one resource never
overlap: a trigger arriving while a pass runs marks the resource dirty and the running pass
goes once more, so bursts of child events collapse into one or two passes. The watch echo
of the operator's own apply (same resourceVersion as the apply's answer) triggers nothing:
the pass that wrote it already saw that state.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from pdx import kinds, labels, rules
from pdx.controller import metrics
from pdx.controller.kube import ApiError, Kube, make_api_client
from pdx.controller.rbac import PEERING_NAME
from pdx.controller.reconcile import Outcome, StatsFetcher, reconcile
from pdx.spec import GROUP, PLURAL, VERSION

RESYNC_SECONDS = float(os.environ.get("PDX_RESYNC_SECONDS", "30"))
STATS_TIMEOUT_SECONDS = 2.0
RETRY_DELAY_SECONDS = 10


def fetch_router_stats(base_url: str) -> Mapping[str, Any] | None:
    """GET /v1/pdx/stats with a short timeout; the periodic check tolerates any failure."""
    with urllib.request.urlopen(f"{base_url}/v1/pdx/stats", timeout=STATS_TIMEOUT_SECONDS) as resp:
        data = json.loads(resp.read())
    return data if isinstance(data, dict) else None


@dataclass
class _Gate:
    lock: threading.Lock = field(default_factory=threading.Lock)
    dirty: bool = False
    # (kind, name) -> resourceVersion of the last apply of that child (see `_is_echo`).
    written: dict[tuple[str, str], str] = field(default_factory=dict)


_gates: dict[tuple[str, str], _Gate] = {}
_gates_lock = threading.Lock()


def _gate(key: tuple[str, str]) -> _Gate:
    with _gates_lock:
        return _gates.setdefault(key, _Gate())


def exclusive(key: tuple[str, str], run: Callable[[], Outcome | None], *, wait: bool) -> Outcome | None:
    """Run passes for one resource one at a time; `wait=False` callers only mark it dirty."""
    gate = _gate(key)
    if not gate.lock.acquire(blocking=wait):
        gate.dirty = True
        return None
    try:
        while True:
            gate.dirty = False
            result = run()
            if not gate.dirty:
                return result
    finally:
        gate.lock.release()


def _post(outcome: Outcome) -> None:
    for ev in outcome.events:
        kopf.event(cast(Any, outcome.body), type=ev.type, reason=ev.reason, message=ev.message[:1000])


def _kube(memo: Any) -> Kube:
    kube: Kube | None = getattr(memo, "kube", None)
    if kube is None:
        kube = memo.kube = Kube(make_api_client())
    return kube


def _pass(memo: Any, namespace: str, name: str, *, stats: bool, wait: bool, logger: Any) -> Outcome | None:
    fetch: StatsFetcher | None = getattr(memo, "fetch_stats", fetch_router_stats) if stats else None

    def once() -> Outcome | None:
        t0 = time.perf_counter()
        try:
            outcome = reconcile(_kube(memo), namespace, name, fetch_stats=fetch)
        except ApiError:
            metrics.failed("api")
            metrics.passed("failed", time.perf_counter() - t0)
            raise
        metrics.passed(_result(outcome), time.perf_counter() - t0)
        if outcome is not None and outcome.error:
            metrics.failed("apply")
        if outcome is not None:  # every pass reports its own actions, also the coalesced ones
            _gate((namespace, name)).written.update(outcome.versions)
            _post(outcome)
            if outcome.writes:
                logger.info(
                    "reconciled %s/%s: applied %s, pruned %s, status %s",
                    namespace,
                    name,
                    outcome.applied or "-",
                    outcome.pruned or "-",
                    sorted(outcome.status) or "-",
                )
        return outcome

    return exclusive((namespace, name), once, wait=wait)


def _result(outcome: Outcome | None) -> str:
    if outcome is None:
        return "gone"
    if outcome.error:
        return "failed"
    if outcome.invalid:
        return "invalid"
    return "wrote" if outcome.writes else "idle"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Peering for two replicas, pdx-prefixed kopf bookkeeping, the API client."""
    settings.peering.name = PEERING_NAME
    settings.peering.mandatory = os.environ.get("PDX_PEERING_MANDATORY", "") == "1"
    # kopf peering freezes every replica on a priority tie, so each replica draws its own
    # priority (a Deployment gives them all one env): the highest serves, the rest stand by.
    if os.environ.get("PDX_OPERATOR_PRIORITY"):
        settings.peering.priority = int(os.environ["PDX_OPERATOR_PRIORITY"])
    elif settings.peering.priority == 0:
        settings.peering.priority = 1 + secrets.randbelow(2**30)
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=labels.KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=labels.KOPF_PREFIX)
    settings.persistence.finalizer = labels.FINALIZER
    settings.posting.level = logging.INFO
    settings.execution.max_workers = int(os.environ.get("PDX_WORKERS", "16"))
    if getattr(memo, "kube", None) is None:
        memo.kube = Kube(make_api_client())
    rules.warm_up()
    if getattr(memo, "metrics_port", None) is None:
        memo.metrics_port = metrics.serve()


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def converge(namespace: str | None, name: str, memo: Any, logger: Any, **_: Any) -> None:
    assert namespace is not None  # the resource is namespaced
    try:
        outcome = _pass(memo, namespace, name, stats=False, wait=True, logger=logger)
    except ApiError as err:
        raise kopf.TemporaryError(str(err), delay=RETRY_DELAY_SECONDS) from err
    if outcome is not None and outcome.error:
        raise kopf.TemporaryError(outcome.error, delay=RETRY_DELAY_SECONDS)


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync(namespace: str | None, name: str, memo: Any, logger: Any, **_: Any) -> None:
    """Drift repair and the router's reuse counters; errors wait for the next tick."""
    assert namespace is not None
    try:
        _pass(memo, namespace, name, stats=True, wait=False, logger=logger)
    except ApiError as err:
        logger.warning("periodic reconcile of %s/%s failed: %s", namespace, name, err)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def deleted(namespace: str | None, name: str, logger: Any, **_: Any) -> None:
    """No finalizer: children carry ownerReferences and the garbage collector removes them."""
    with _gates_lock:
        _gates.pop((namespace or "", name), None)
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


def child_event(event: Mapping[str, Any], body: Mapping[str, Any], memo: Any, logger: Any, **_: Any) -> None:
    """A watched child changed: reconcile its owner (a deleted or hand-edited set comes back)."""
    if event.get("type") is None:  # the initial listing: resume handles those resources
        return
    owner = _owner(body)
    namespace = (body.get("metadata") or {}).get("namespace")
    if owner is None or not namespace or _is_echo(event, body, namespace, owner):
        return
    try:
        _pass(memo, namespace, owner, stats=False, wait=False, logger=logger)
    except ApiError as err:
        logger.warning("reconcile of %s/%s after a child event failed: %s", namespace, owner, err)


for _watched in (k for k in kinds.CHILDREN if k.watched):
    kopf.on.event(_watched.group, _watched.version, _watched.plural, labels=labels.managed(), id=_watched.plural)(
        child_event
    )
