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

from typing import Any

import kopf


class MemoryDiffBaseStorage(kopf.DiffBaseStorage):
    """Essences by uid; `forget` on deletion keeps it to the CRs that exist."""

    def __init__(self) -> None:
        super().__init__()
        self._essences: dict[str, kopf.BodyEssence] = {}

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return self._essences.get(str(body.metadata.uid))

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        self._essences[str(body.metadata.uid)] = essence

    def forget(self, uid: Any) -> None:
        self._essences.pop(str(uid), None)


__all__ = ["MemoryDiffBaseStorage"]
