"""One level-triggered reconcile pass: read -> render -> apply what differs -> report.

Every pass starts from the whole current state (the CR, its children, its pods: a `Snapshot`,
listed from the API or fed by the operator's watches, see state.py), never from the event that
triggered it, so create, update, resume, the timer and child events all run the same code
and a stale trigger cannot roll anything back. A child is written only if it is missing,
was rendered differently (annotation `pdx.dev/applied-hash`), or was changed by hand (a
rendered field differs live): a second pass with nothing changed sends no write at all.
An invalid spec writes nothing but the InvalidSpec status; the running fleet stays as is.
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pdx import labels as labels_
from pdx.controller import advice, rollout, status
from pdx.controller.kube import ApiError, Kube
from pdx.controller.rollout import PodView
from pdx.controller.state import ListReads, Reads, Snapshot
from pdx.render import config_hash, render
from pdx.render.meta import ROLES, canonical_hash, router_url
from pdx.render.router import ENDPOINTS_FILE
from pdx.resource import SpecError, Target, load
from pdx.rules import DNS_LABEL, MAX_NAME_LENGTH
from pdx.spec import KIND, DisaggregatedInferenceSpec, DisaggregatedInferenceStatus
from pdx_contract.endpoints import EndpointsDocument

log = logging.getLogger(__name__)

# The kinds `render` produces; children of these kinds owned by the CR and no longer rendered
# (e.g. a PodDisruptionBudget after scaling to one router) are pruned.

StatsFetcher = Callable[[str], Mapping[str, Any] | None]


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the CR (the handlers post them through kopf)."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Outcome:
    body: dict[str, Any]  # the CR as read at the start of the pass
    applied: list[str] = field(default_factory=list)  # "Kind/name (created|updated|repaired)"
    pruned: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)  # the keys written, empty if none
    invalid: str | None = None
    error: str | None = None
    # (kind, name) -> resourceVersion the API answered to this pass's applies: the watch
    # events carrying exactly these versions are echoes of our own writes, nothing new.
    versions: dict[tuple[str, str], str] = field(default_factory=dict)
    # What the API answered to each write (the CR's status patch under its own kind and name),
    # and the uids of what was pruned: the watch-fed state holds them until the echoes arrive.
    answers: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    deleted: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def writes(self) -> int:
        return len(self.applied) + len(self.pruned) + (1 if self.status else 0)


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def subset(desired: Any, live: Any) -> bool:
    """Whether every rendered field has the same value live; the server may add defaults, and
    leaves out a field whose value is its zero value (Go's omitempty: a Service's
    `publishNotReadyAddresses: false` is stored as nothing), so a rendered false, 0, "", [] or
    {} matches a missing field. Rendered manifests and parsed JSON are plain dicts, lists and
    scalars: telling those by their type first skips the ABC machinery of isinstance(Mapping),
    a fifth of a pass's CPU."""
    kind = type(desired)
    if kind is dict or (kind not in _SCALARS and kind is not list and isinstance(desired, Mapping)):
        return (type(live) is dict or isinstance(live, Mapping)) and all(
            subset(v, live[k]) if k in live else not v for k, v in desired.items()
        )
    if kind is list:
        return type(live) is list and len(desired) == len(live) and all(map(subset, desired, live))
    return bool(desired == live)


_SCALARS = (str, int, float, bool, type(None))


def stamp(obj: dict[str, Any]) -> dict[str, Any]:
    """The manifest plus the hash of what was rendered: removals (which `subset` cannot see)
    change the hash, so a field dropped from the render is dropped live by the next apply."""
    meta = dict(obj["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), labels_.APPLIED_HASH: canonical_hash(obj, 16)}
    return {**obj, "metadata": meta}


def needs_apply(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> str | None:
    """Why the child must be applied (created/updated/repaired), or None if it is current."""
    if live is None or (live.get("metadata") or {}).get("deletionTimestamp"):
        return "created"
    have = ((live.get("metadata") or {}).get("annotations") or {}).get(labels_.APPLIED_HASH)
    if have != desired["metadata"]["annotations"][labels_.APPLIED_HASH]:
        return "updated"
    if not subset(desired, live):
        return "repaired"
    return None


# Holds an autoscaled StatefulSet's replica count while its autoscaler takes over (see below).
HANDOVER_MANAGER = "pdx-replicas-handover"


def replicas_handover(
    desired: Mapping[str, Any], live: Mapping[str, Any] | None, manager: str
) -> dict[str, Any] | None:
    """The apply that keeps a StatefulSet's pods when its role turns autoscaled, or None.

    The operator's apply then stops setting `replicas`; server-side apply would remove a field
    its manager owned and no longer sends, and the set would fall to one pod (a decode's KV with
    it) before the autoscaler acts. Applying the live count first under another manager moves
    the field's ownership there, so dropping it from the operator's apply changes nothing.
    """
    if desired.get("kind") != "StatefulSet" or "replicas" in desired.get("spec", {}) or live is None:
        return None
    owned = any(
        m.get("manager") == manager and "f:replicas" in ((m.get("fieldsV1") or {}).get("f:spec") or {})
        for m in (live.get("metadata") or {}).get("managedFields") or []
    )
    if not owned or "replicas" not in (live.get("spec") or {}):
        return None
    meta = desired["metadata"]
    return {
        "apiVersion": desired["apiVersion"],
        "kind": desired["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": {"replicas": live["spec"]["replicas"]},
    }


def pod_view(pod: Mapping[str, Any]) -> PodView:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    st = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
    waiting = termination = None
    for cs in st.get("containerStatuses") or []:
        reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason")
        if reason:
            waiting = reason
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            message = (state.get("terminated") or {}).get("message")
            if message:
                termination = str(message).strip()
                break
    component = labels.get(labels_.COMPONENT, "")
    return PodView(
        name=meta.get("name", ""),
        role=labels.get(labels_.ROLE) or component,
        generation=labels.get(labels_.CONFIG_HASH),
        ready=ready,
        ip=st.get("podIP"),
        terminating=bool(meta.get("deletionTimestamp")),
        waiting_reason=waiting,
        termination=termination,
    )


def owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return uid is not None and any(r.get("uid") == uid and r.get("controller") for r in refs)


_specs: OrderedDict[str, DisaggregatedInferenceSpec | SpecError] = OrderedDict()
_specs_lock = threading.Lock()
_validating = threading.Lock()
SPEC_CACHE_SIZE = 2048


def load_target(body: Mapping[str, Any], namespace: str) -> Target:
    """`load` with a cache by spec: the CEL rules cost ~30 ms per evaluation, and every trigger
    (timer, child events) would otherwise validate an unchanged spec again, and every resource
    of a fleet stamped from one template the same spec. The metadata checks `load` makes
    before the spec's depend on the name; they are cheap, so a hit still makes them."""
    meta = body.get("metadata") or {}
    name = meta.get("name", "")
    # A valid spec is valid under any (valid) name; an error may be the name's, so it is kept by both.
    key = json.dumps([body.get("apiVersion"), body.get("kind"), body.get("spec")], sort_keys=True)
    error_key = json.dumps([name, key])
    # `load` says what is wrong with a bad name; a valid spec under it is no answer.
    bad_name = not isinstance(name, str) or not re.fullmatch(DNS_LABEL, name) or len(name) > MAX_NAME_LENGTH

    def cached() -> DisaggregatedInferenceSpec | SpecError | None:
        with _specs_lock:
            return _specs.get(error_key) or (None if bad_name else _specs.get(key))

    hit = cached()
    if hit is None:
        with _validating:  # passes racing on one new spec validate it once (CPU-bound anyway)
            hit = cached()
            if hit is None:
                try:
                    hit = load(dict(body), default_namespace=namespace).spec
                except SpecError as err:
                    hit = err
                with _specs_lock:
                    _specs[error_key if isinstance(hit, SpecError) else key] = hit
                    while len(_specs) > SPEC_CACHE_SIZE:
                        _specs.popitem(last=False)
    if isinstance(hit, SpecError):
        raise hit
    return Target(
        name=meta["name"],
        namespace=meta.get("namespace") or namespace,
        spec=hit,
        uid=meta.get("uid"),
        generation=meta.get("generation"),
    )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _previous_status(body: Mapping[str, Any]) -> DisaggregatedInferenceStatus | None:
    raw = body.get("status")
    if not isinstance(raw, Mapping):
        return None
    try:
        return DisaggregatedInferenceStatus.model_validate({k: v for k, v in raw.items() if k != "kopf"})
    except ValueError:
        return None  # someone wrote garbage into status: start over


def _desired_from_live(children: Mapping[tuple[str, str], Mapping[str, Any]]) -> dict[str, int]:
    """Replica counts in force while the spec is invalid (nothing new was applied)."""
    out: dict[str, int] = {}
    for (kind, _), obj in children.items():
        labels = (obj.get("metadata") or {}).get("labels") or {}
        component = labels.get(labels_.COMPONENT)
        if kind in ("StatefulSet", "Deployment") and component in ("prefill", "decode", "router"):
            out[component] = int((obj.get("spec") or {}).get("replicas") or 0)
    return out


def reconcile(
    kube: Kube,
    namespace: str,
    name: str,
    *,
    fetch_stats: StatsFetcher | None = None,
    now: Callable[[], str] = _now,
    reads: Reads | None = None,
) -> Outcome | None:
    """One pass for one DisaggregatedInference; None when it no longer exists.

    `reads` is where the state comes from: by default one GET and a LIST per kind
    (`ListReads`); the operator passes its watch-fed state instead. `fetch_stats` (the
    periodic check only) reads the router's reuse counters; its failure changes nothing
    but the absence of fresh numbers.
    """
    snap = (reads or ListReads(kube)).read(namespace, name)
    if snap is None:
        return None
    return reconcile_snapshot(kube, namespace, name, snap, fetch_stats=fetch_stats, now=now)


def reconcile_snapshot(
    kube: Kube,
    namespace: str,
    name: str,
    snap: Snapshot,
    *,
    fetch_stats: StatsFetcher | None = None,
    now: Callable[[], str] = _now,
) -> Outcome:
    """The pass proper: (state snapshot) -> writes through `kube`, reported in the Outcome.
    It reads nothing from the API, so with nothing to do it sends no request."""
    body = snap.body
    meta = body.get("metadata") or {}
    out = Outcome(body=body)
    if meta.get("deletionTimestamp"):
        return out  # the garbage collector removes the children through their ownerReferences
    uid = meta.get("uid")
    previous = _previous_status(body)

    children = {key: obj for key, obj in snap.children.items() if owned_by(obj, uid)}
    pods = [pod_view(p) for p in snap.pods]

    try:
        target: Target | None = load_target(body, namespace)
    except SpecError as err:
        target = None
        out.invalid = str(err)

    published: str | None = None
    if target is not None:
        autoscaled = {r for r in ROLES if target.spec.role(r).autoscaling is not None}
        target_hash = config_hash(target)
        published, endpoints = rollout.endpoints(pods, target_hash)
        desired_objs = [stamp(o) for o in render(target, endpoints)]
        wanted = {_key(o) for o in desired_objs}
        old_hash = previous.config_hash if previous else None
        if old_hash and old_hash != target_hash:
            out.events.append(
                Event(
                    "Normal", "RollingOut", f"prefill and decode move together from config {old_hash} to {target_hash}"
                )
            )
        try:
            for obj in desired_objs:
                why = needs_apply(obj, children.get(_key(obj)))
                if why is None:
                    continue
                if (held := replicas_handover(obj, children.get(_key(obj)), kube.field_manager)) is not None:
                    kube.apply(held, field_manager=HANDOVER_MANAGER)
                answer = kube.apply(obj)
                version = ((answer or {}).get("metadata") or {}).get("resourceVersion")
                if version:
                    out.versions[_key(obj)] = str(version)
                    out.answers[_key(obj)] = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], **answer}
                out.applied.append(f"{obj['kind']}/{obj['metadata']['name']} ({why})")
            for key, obj in children.items():
                if key not in wanted:
                    kube.delete(obj["apiVersion"], obj["kind"], namespace, key[1])
                    out.pruned.append(f"{key[0]}/{key[1]}")
                    out.deleted[key] = str((obj.get("metadata") or {}).get("uid") or "")
        except ApiError as err:
            out.error = str(err)
            out.events.append(Event("Warning", "ApplyFailed", str(err)))
        # One event per kind of action and pass, not one per object: 11 children are created at once.
        repaired = [i for i in out.applied if i.endswith("(repaired)")]
        applied = [i for i in out.applied if not i.endswith("(repaired)")]
        if applied:
            out.events.append(Event("Normal", "Applied", f"config {target_hash}: " + ", ".join(applied)))
        if repaired:
            out.events.append(Event("Normal", "DriftRepaired", "changed by hand, restored: " + ", ".join(repaired)))
        if out.pruned:
            out.events.append(Event("Normal", "Pruned", "no longer rendered: " + ", ".join(out.pruned)))
        before = _published_before(children)
        if before is not None and before != published and not out.error:
            out.events.append(Event("Normal", "EndpointsSwitched", f"the router now pairs config {published} only"))
        observed = status.Observation(
            generation=meta.get("generation"),
            config_hash=target_hash,
            # An autoscaled role wants what its autoscaler last set on the StatefulSet.
            desired={
                **{r: target.spec.role(r).replicas for r in ROLES},
                **{r: n for r, n in _desired_from_live(children).items() if r in autoscaled},
                "router": target.spec.router.replicas,
            },
            pods=pods,
            published=published,
            apply_error=out.error,
            router_address=router_url(target),
            bidirectional=target.spec.kv_transfer.bidirectional,
            reuse=_reuse(fetch_stats, router_url(target)),
        )
    else:
        was_invalid = previous is not None and any(
            c.type == "InvalidSpec" and c.status == "True" and c.message == out.invalid for c in previous.conditions
        )
        if not was_invalid:
            out.events.append(Event("Warning", "InvalidSpec", f"edit rejected, nothing applied: {out.invalid}"))
        observed = status.Observation(
            generation=meta.get("generation"),
            config_hash=previous.config_hash if previous else None,
            desired=_desired_from_live(children),
            pods=pods,
            published=_published_before(children),
            invalid=out.invalid,
            router_address=previous.router_address if previous else None,
            bidirectional=previous.bidirectional if previous else None,
        )

    new = status.compute(observed, previous, now())
    out.status = _status_delta(body.get("status") or {}, new)
    if previous is not None and out.status:
        _transition_events(previous, new, out)
    if out.status:
        cr = kube.patch_status(namespace, name, out.status)
        if cr is not None and cr.get("metadata"):
            out.answers[(body.get("kind") or KIND, name)] = cr
    return out


def _published_before(children: Mapping[tuple[str, str], Mapping[str, Any]]) -> str | None:
    """The generation currently in the endpoints ConfigMap (as last applied)."""
    for (kind, _), obj in children.items():
        data = obj.get("data") or {}
        if kind == "ConfigMap" and ENDPOINTS_FILE in data:
            try:
                gens = EndpointsDocument.model_validate_json(data[ENDPOINTS_FILE]).generations()
            except ValueError:
                return None
            return next(iter(gens)) if len(gens) == 1 else None
    return None


def _reuse(fetch: StatsFetcher | None, url: str) -> Any:
    if fetch is None:
        return None
    try:
        stats = fetch(url)
    except Exception as err:  # best effort: the router may be starting, gone, or unreachable
        log.debug("router stats from %s unavailable: %s", url, err)
        return None
    return advice.reuse_status(stats) if stats else None


def _status_delta(live: Mapping[str, Any], new: DisaggregatedInferenceStatus) -> dict[str, Any]:
    """Only the top-level keys whose value changed (a merge patch of exactly those)."""
    doc = new.model_dump(by_alias=True, exclude_none=True, mode="json")
    return {k: v for k, v in doc.items() if live.get(k) != v}


def _transition_events(before: DisaggregatedInferenceStatus, after: DisaggregatedInferenceStatus, out: Outcome) -> None:
    old = {c.type: c for c in before.conditions}
    for c in after.conditions:
        prev = old.get(c.type)
        if prev is not None and prev.status == c.status:
            continue
        if c.type == "InvalidSpec" and c.status == "False" and prev is not None:
            out.events.append(Event("Normal", "SpecValid", "the spec is valid again; applying it"))
        elif c.type == "Ready":
            kind: Literal["Normal", "Warning"] = "Normal" if c.status == "True" else "Warning"
            out.events.append(Event(kind, "Ready" if c.status == "True" else "NotReady", c.message))
        elif c.type == "Degraded" and c.status == "True" and c.reason != "InvalidSpec":
            out.events.append(Event("Warning", c.reason, c.message))


__all__ = ["Event", "Outcome", "needs_apply", "reconcile", "reconcile_snapshot", "subset"]
