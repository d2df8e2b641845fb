"""A decode being scaled away waits for its conversations to move, and never forever."""

from __future__ import annotations

import pytest

from pdx_engine import drain


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_wait_ends_when_nothing_is_held_or_at_the_bound_or_when_the_router_cannot_say() -> None:
    clock = Clock()
    answers = iter([3, 2, 0])
    why = drain.drain("http://r", "http://d", 60, lambda _r, _d: next(answers), clock, clock.sleep)
    assert why == "no conversation's KV left here" and clock.now == 2 * drain.POLL_SECONDS
    clock = Clock()
    why = drain.drain("http://r", "http://d", 10, lambda _r, _d: 5, clock, clock.sleep)
    assert why.startswith("5 entries still here after 10 s") and clock.now == pytest.approx(10)
    why = drain.drain("http://r", "http://d", 10, lambda _r, _d: None, clock, clock.sleep)
    assert why == "the router did not answer: not waiting"


def test_without_its_settings_the_drain_does_not_wait(capsys: pytest.CaptureFixture[str]) -> None:
    assert drain.main({"POD_IP": "10.0.0.5"}) == 0
    assert "not waiting" in capsys.readouterr().err


def test_the_decode_names_itself_as_the_routers_endpoints_file_does() -> None:
    assert drain.decode_url({"POD_IP": "10.0.0.5"}) == "http://10.0.0.5:8000"
    assert drain.decode_url({"POD_IP": "fd00::5", "PDX_HTTP_PORT": "9000"}) == "http://[fd00::5]:9000"


def test_an_unreachable_router_is_none_not_a_wait() -> None:
    assert drain.holding("http://127.0.0.1:9", "http://10.0.0.5:8000") is None
