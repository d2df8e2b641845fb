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

from collections.abc import Iterable
from typing import Any, cast

import kopf


class MemoryDiffBaseStorage(kopf.DiffBaseStorage):
    """Essences by uid; `forget` on deletion keeps it to the CRs that exist."""

    def __init__(self) -> None:
        super().__init__()
        self._essences: dict[str, kopf.BodyEssence] = {}

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        """kopf's essence, from the body without its status and system metadata: kopf builds it
        on every event of the CR by deep-copying the whole body, then drops those parts. No
        handler here filters on fields (`extra_fields` stays empty), so they never matter."""
        meta = body.get("metadata") or {}
        trimmed = {k: v for k, v in body.items() if k != "status"}
        trimmed["metadata"] = {k: meta[k] for k in ("labels", "annotations") if k in meta}
        return super().build(body=cast(kopf.Body, trimmed), extra_fields=extra_fields)

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
