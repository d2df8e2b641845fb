"""The routers' counters fetched beside the passes (pdx.controller.routerstats)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from pdx import labels
from pdx.controller.routerstats import StatsCache
from pdx.controller.state import Snapshot
from tests.operator.conftest import cr_document
from tests.support.control_plane import wait_for

KEY = ("inference", "demo")
URL = "http://demo-router.inference.svc:8000"


class Router:
    """A fetch whose answers the test hands out one at a time."""

    def __init__(self) -> None:
        self.answers: list[Mapping[str, Any] | Exception] = []
        self.go = threading.Semaphore(0)
        self.asked: list[str] = []

    def __call__(self, url: str) -> Mapping[str, Any] | None:
        self.asked.append(url)
        assert self.go.acquire(timeout=30)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def router() -> Router:
    return Router()


@pytest.fixture
def woken() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def cache(router: Router, woken: list[tuple[str, str]]) -> Iterator[StatsCache]:
    c = StatsCache(router, woken.append)
    yield c
    router.go.release(100)
    c.close()


def _answer(router: Router, answer: Mapping[str, Any] | Exception) -> None:
    router.answers.append(answer)
    router.go.release()


def test_a_refresh_returns_before_the_router_answers(
    cache: StatsCache, router: Router, woken: list[tuple[str, str]]
) -> None:
    assert cache.refresh(KEY, URL)
    wait_for("the fetch asked", lambda: router.asked == [URL])
    assert cache.latest(KEY) is None and woken == []
    _answer(router, {"reuse": {"hit": 1}})
    wait_for("the resource woken", lambda: woken == [KEY])
    assert cache.latest(KEY) == {"reuse": {"hit": 1}}


def test_one_fetch_per_resource_is_in_flight(cache: StatsCache, router: Router) -> None:
    assert cache.refresh(KEY, URL)
    assert not cache.refresh(KEY, URL)
    assert cache.refresh(("inference", "other"), URL)  # another resource has its own
    _answer(router, {"a": 1})
    _answer(router, {"b": 1})
    wait_for(
        "both answered", lambda: cache.latest(KEY) is not None and cache.latest(("inference", "other")) is not None
    )
    assert cache.refresh(KEY, URL)  # answered: the next periodic pass may ask again


def test_a_failed_or_unchanged_answer_keeps_the_counters_and_wakes_nobody(
    cache: StatsCache, router: Router, woken: list[tuple[str, str]]
) -> None:
    cache.refresh(KEY, URL)
    _answer(router, {"reuse": {"hit": 2}})
    wait_for("the first answer", lambda: woken == [KEY])
    for answer in (OSError("connection refused"), {"reuse": {"hit": 2}}):
        assert cache.refresh(KEY, URL)
        _answer(router, answer)
        wait_for("the fetch done", lambda: not cache.pending(KEY))
    assert len(router.asked) == 3
    assert woken == [KEY]
    assert cache.latest(KEY) == {"reuse": {"hit": 2}}


def test_a_late_answer_for_a_forgotten_resource_is_dropped(
    cache: StatsCache, router: Router, woken: list[tuple[str, str]]
) -> None:
    cache.refresh(KEY, URL)
    wait_for("the fetch asked", lambda: router.asked == [URL])
    cache.forget(KEY)
    _answer(router, {"reuse": {"hit": 3}})
    wait_for("the fetch done", lambda: not cache.pending(KEY))
    assert cache.latest(KEY) is None and woken == []


def _pod(component: str, ready: bool, ip: str | None = "10.0.0.9") -> dict[str, Any]:
    return {
        "metadata": {"name": f"demo-{component}-0", "labels": {labels.COMPONENT: component}},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


@pytest.mark.parametrize(
    ("pods", "asked"),
    [
        ([], False),  # no router pod yet
        ([_pod("router", ready=False)], False),  # starting
        ([_pod("router", ready=True, ip=None)], False),  # ready but with no address
        ([_pod("prefill", ready=True), _pod("decode", ready=True)], False),  # engines only
        ([_pod("router", ready=False), _pod("router", ready=True)], True),  # one of two serves
    ],
)
def test_a_periodic_pass_asks_the_router_only_while_one_of_its_pods_is_ready(
    pods: list[dict[str, Any]], asked: bool
) -> None:
    from pdx.controller import handlers

    body = {**cr_document(), "metadata": {"name": "demo", "namespace": "inference", "uid": "u-1"}}
    snap = Snapshot(body=body, children={}, pods=pods)
    assert handlers._router_url(snap, "inference") == (URL if asked else None)
