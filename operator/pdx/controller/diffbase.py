"""kopf's diff-base (the last handled spec, labels, annotations) kept in memory, not in an annotation.

kopf stores it after every handled create/update/resume; in an annotation that is one more
PATCH of the CR per change, and one more watch event that kopf processes in full. The
operator's handlers are level-triggered: create, update and resume run the same pass from
the whole current state, and none reads kopf's `old`/`new`/`diff`. kopf needs the diff-base
only to tell a change from none. Kept in this process, a restarted operator (or a standby
that takes over) finds none and kopf calls every CR's creation handler instead of its
resume handler: the same pass. Nothing else differs.
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


__all__ = ["MemoryDiffBaseStorage"]
