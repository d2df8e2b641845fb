"""kopf's bookkeeping of handled changes kept in memory, not in annotations of the CR.

kopf stores its diff-base (the last handled spec, labels, annotations) after every handled
create/update/resume, and its handler progress (plus a `kopf-managed` marker) when a handler
runs; in annotations each is a PATCH of the CR and one more watch event that kopf processes
in full. The operator's handlers are level-triggered: create, update and resume run the same
pass from the whole current state, and none reads kopf's `old`/`new`/`diff` or retry count.
kopf needs the diff-base only to tell a change from none, and the progress only to retry a
failed handler later in this process. Kept in memory, a restarted operator (or a standby
that takes over) finds neither: kopf calls every CR's creation handler instead of its resume
handler (the same pass), and a retry pending at the restart runs at once instead of after
its delay. Waking itself up for a retry still writes a dummy annotation (the only way kopf
gets an event to act on then), through kopf's annotation storage.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any, cast

import kopf
import orjson

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _copy(value: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of parsed JSON; deepcopy where orjson refuses (an integer beyond 64 bits)."""
    try:
        out: dict[str, Any] = orjson.loads(orjson.dumps(value))
    except TypeError:  # orjson.JSONEncodeError
        return copy.deepcopy(value)
    return out


class MemoryDiffBaseStorage(kopf.DiffBaseStorage):
    """Essences by uid; `forget` on deletion keeps it to the CRs that exist."""

    def __init__(self) -> None:
        super().__init__()
        self._essences: dict[str, kopf.BodyEssence] = {}

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        """kopf's essence: the body without apiVersion, kind, status and system metadata, and
        without kopf's and kubectl's annotations. kopf builds it on every event of the CR by
        deep-copying the whole body (copy.deepcopy: a third of a millisecond for a CR with its
        defaults on the real API server), then drops those parts; here only what is kept is
        copied, through orjson (a tenth of that). No handler here filters on fields, so
        `extra_fields` (kopf's path, kept for them) is never given."""
        if extra_fields:
            return super().build(body=body, extra_fields=extra_fields)
        meta = body.get("metadata") or {}
        kept = {k: v for k, v in body.items() if k not in ("apiVersion", "kind", "metadata", "status")}
        if picked := {k: meta[k] for k in ("labels", "annotations") if k in meta}:
            kept["metadata"] = picked
        essence = _copy(kept)
        annotations = (essence.get("metadata") or {}).get("annotations") or {}
        ignored = self._detect_marked_prefixes(annotations)
        for key in list(annotations):
            if any(key.startswith(f"{prefix}/") for prefix in ignored) or key == LAST_APPLIED:
                del annotations[key]
        self.remove_empty_stanzas(cast(kopf.BodyEssence, essence))  # no ignored_fields: __init__ takes none
        return cast(kopf.BodyEssence, essence)

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return self._essences.get(str(body.metadata.uid))

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        self._essences[str(body.metadata.uid)] = essence

    def forget(self, uid: Any) -> None:
        self._essences.pop(str(uid), None)


class MemoryProgressStorage(kopf.ProgressStorage):
    """Handler progress by (uid, handler id); kopf's annotations only to wake up for a retry."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self._records: dict[tuple[str, str], kopf.ProgressRecord] = {}
        self._annotations = kopf.AnnotationsProgressStorage(prefix=prefix)
        self._marked = f"{prefix}/"

    def fetch(self, *, key: Any, body: kopf.Body) -> kopf.ProgressRecord | None:
        return self._records.get((str(body.metadata.uid), str(key)))

    def store(self, *, key: Any, record: kopf.ProgressRecord, body: kopf.Body, patch: kopf.Patch) -> None:
        self._records[(str(body.metadata.uid), str(key))] = record

    def purge(self, *, key: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        self._records.pop((str(body.metadata.uid), str(key)), None)

    def touch(self, *, body: kopf.Body, patch: kopf.Patch, value: str | None) -> None:
        self._annotations.touch(body=body, patch=patch, value=value)

    def clear(self, *, essence: kopf.BodyEssence) -> kopf.BodyEssence:
        """The essence without kopf's annotations (they never count as a change). kopf's own
        deep-copies every essence first, twice per event of the CR; one with nothing to
        remove (all but a retry's wake-up) is returned as it is: kopf only compares them."""
        meta: Any = essence.get("metadata")
        annotations = meta.get("annotations") if isinstance(meta, dict) else None
        marked = any(k.startswith(self._marked) for k in annotations or ())
        empty = meta == {} or essence.get("status") == {}
        if isinstance(meta, dict):
            empty = empty or meta.get("annotations") == {} or meta.get("labels") == {}
        if not marked and not empty:
            return essence
        return self._annotations.clear(essence=essence)

    def forget(self, uid: Any) -> None:
        for key in [k for k in self._records if k[0] == str(uid)]:
            del self._records[key]


__all__ = ["MemoryDiffBaseStorage", "MemoryProgressStorage"]
