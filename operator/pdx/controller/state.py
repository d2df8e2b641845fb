"""What one reconcile pass reads: the CR, its children, its pods, as one `Snapshot`.

Two sources produce it:

- `ListReads`: GET the CR and LIST every child kind and pods (about ten requests). Tests, the
  CLI and any one-off pass use it; it needs nothing running.
- `WatchState`: the operator's. kopf's watch of the CR feeds a `@kopf.index`, the operator's
  own list+watch streams (`feed.Feeds`) one store per child kind and pods, all keyed by
  (namespace, instance) and read alike; a snapshot is a few dict look-ups and sends no
  request. The handlers act only once every feed and kopf's index have their first listing,
  so a restarted operator acts only on complete state.

A watch lags behind the operator's own writes: the next pass would see a child as it was
before the apply (and apply it again) until the echo arrives. `WatchState` therefore keeps
what the API answered to this operator's writes (`record`) and prefers it while it is newer
than what the watch delivered; the watch's copy takes over once it catches up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pdx import kinds
from pdx import labels as labels_
from pdx.controller.kube import Kube

Key = tuple[str, str]  # (kind, name)


@dataclass(frozen=True)
class Snapshot:
    body: dict[str, Any]  # the CR
    children: dict[Key, dict[str, Any]]  # every object of a child kind labelled with the instance
    pods: list[dict[str, Any]]

    def fingerprint(self) -> tuple[Any, ...]:
        """Identical for identical inputs: a pass on an unchanged snapshot would do nothing."""
        return (
            _version(self.body),
            tuple(sorted((k, _version(o)) for k, o in self.children.items())),
            tuple(sorted(((p.get("metadata") or {}).get("name", ""), _version(p)) for p in self.pods)),
        )


class Reads(Protocol):
    def read(self, namespace: str, name: str) -> Snapshot | None:
        """The state of one resource, or None when the CR does not exist."""


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _rv(obj: Mapping[str, Any]) -> int:
    """resourceVersion as a number (etcd revisions are); -1 when it is not one, so the
    watch's copy always wins and nothing worse than a repeated apply can follow."""
    try:
        return int(_version(obj))
    except ValueError:
        return -1


def _key(obj: Mapping[str, Any]) -> Key:
    return obj["kind"], obj["metadata"]["name"]


@dataclass
class ListReads:
    """One GET and one LIST per kind, every pass: simple, and O(resources) requests per resync."""

    kube: Kube

    def read(self, namespace: str, name: str) -> Snapshot | None:
        body = self.kube.get_resource(namespace, name)
        if body is None:
            return None
        selector = labels_.instance(name)
        children: dict[Key, dict[str, Any]] = {}
        for child in kinds.CHILDREN:
            for obj in self.kube.list(child.api_version, child.kind, namespace, selector):
                children[_key(obj)] = obj
        pods = self.kube.list(kinds.POD.api_version, kinds.POD.kind, namespace, selector)
        return Snapshot(body=body, children=children, pods=pods)


def index_key(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (namespace, instance) a child or pod is filed under, None for foreign objects."""
    meta = body.get("metadata") or {}
    instance = (meta.get("labels") or {}).get(labels_.INSTANCE)
    namespace = meta.get("namespace")
    return (namespace, instance) if isinstance(instance, str) and isinstance(namespace, str) else None


@dataclass
class WatchState:
    """Snapshots from the watch-fed indexes plus the answers to this operator's own writes.

    `indices` maps each kind's index id to its index: kopf's for the CR (passed to every
    handler as a keyword argument), a feed's store for the others; anything with
    `get(where, default)` answering objects. Used on kopf's event loop only, where the
    indexes change, so neither needs a lock.
    """

    # (namespace, instance) -> (kind, name) -> object as the API answered our apply or status patch
    written: dict[tuple[str, str], dict[Key, dict[str, Any]]] = field(default_factory=dict)
    # (namespace, instance) -> (kind, name) -> uid of an object this operator deleted
    deleted: dict[tuple[str, str], dict[Key, str]] = field(default_factory=dict)

    def read_from(self, indices: Mapping[str, Any], namespace: str, name: str) -> Snapshot | None:
        where = (namespace, name)
        crs = list(indices[index_id(kinds.RESOURCE)].get(where, ()))
        if not crs:
            self.written.pop(where, None)
            self.deleted.pop(where, None)
            return None
        ours = self.written.get(where, {})
        gone = self.deleted.get(where, {})
        merged: dict[Key, dict[str, Any]] = {}
        for kind in kinds.CHILDREN:
            for obj in indices[index_id(kind)].get(where, ()):
                merged[_key(obj)] = obj
        body = crs[0]
        for key, uid in list(gone.items()):
            have = merged.get(key)
            if have is not None and (have.get("metadata") or {}).get("uid") == uid:
                del merged[key]  # the watch has not reported the deletion yet
            else:
                del gone[key]
        for key, obj in list(ours.items()):
            have = body if key[0] == kinds.RESOURCE.kind else merged.get(key)
            if have is not None and _rv(have) >= _rv(obj):
                del ours[key]  # the watch caught up (or someone wrote since)
            elif key[0] == kinds.RESOURCE.kind:
                body = obj
            else:
                merged[key] = obj
        pods = list(indices[index_id(kinds.POD)].get(where, ()))
        return Snapshot(body=body, children=merged, pods=pods)

    def record(
        self, namespace: str, name: str, answers: Mapping[Key, dict[str, Any]], deleted: Mapping[Key, str]
    ) -> None:
        """What one pass wrote: the API's answers, and the uids of what it deleted."""
        where = (namespace, name)
        for key, obj in answers.items():
            if _rv(obj) >= 0:
                self.written.setdefault(where, {})[key] = obj
        for key, uid in deleted.items():
            self.deleted.setdefault(where, {})[key] = uid
            self.written.get(where, {}).pop(key, None)

    def forget(self, namespace: str, name: str) -> None:
        self.written.pop((namespace, name), None)
        self.deleted.pop((namespace, name), None)


def index_id(kind: kinds.Kind) -> str:
    """The kopf index (and keyword argument) name of one kind."""
    return f"pdx_{kind.plural}_index"


__all__ = ["ListReads", "Reads", "Snapshot", "WatchState", "index_id", "index_key"]
