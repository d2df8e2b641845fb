"""The operator's garbage-collector settings: full collections come by time, not by count (with
Python's defaults they traversed the whole watch-fed state every time it grew by a quarter)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from pdx.controller import collector


async def test_full_collections_come_by_time_not_by_allocation_count() -> None:
    started: list[int] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(info["generation"])

    before = gc.get_threshold()
    gc.callbacks.append(seen)
    try:
        collector.tune()
        kept: list[list[dict[str, int]]] = [
            [{} for _ in range(10)] for _ in range(100_000)
        ]  # a heap growing to 1.1M containers
        assert 2 not in started and len(kept) == 100_000  # no full collection; young ones ran
        assert 0 in started
        task = asyncio.create_task(collector.collect_periodically(0.05))
        await asyncio.sleep(0.3)
        task.cancel()
        assert 2 in started  # by time
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*before)
