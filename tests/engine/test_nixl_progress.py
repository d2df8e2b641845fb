"""The NIXL progress-delay plugin: agents get the configured delay, unset changes nothing."""

from __future__ import annotations

import types
from typing import Any

import pytest

from pdx_engine import nixl_progress


class Config:
    pthrDelay = 0


def fake_api() -> tuple[types.ModuleType, list[int]]:
    seen: list[int] = []

    def nixl_agent(name: str, config: Any) -> str:
        seen.append(config.pthrDelay)
        return f"agent {name}"

    bindings = types.SimpleNamespace(nixlAgent=nixl_agent, DEFAULT_COMM_PORT=8888)
    api = types.ModuleType("fake_nixl_api")
    api.nixlBind = bindings  # type: ignore[attr-defined]
    return api, seen


def test_agents_are_built_with_the_delay_and_the_rest_of_the_bindings_is_untouched() -> None:
    api, seen = fake_api()
    assert nixl_progress.patch(api, 1000)
    assert api.nixlBind.nixlAgent("a", Config()) == "agent a"
    assert seen == [1000]
    assert api.nixlBind.DEFAULT_COMM_PORT == 8888


def test_patching_twice_keeps_the_first_wrapper() -> None:
    api, seen = fake_api()
    assert nixl_progress.patch(api, 1000)
    assert not nixl_progress.patch(api, 5)
    api.nixlBind.nixlAgent("a", Config())
    assert seen == [1000]


def test_unset_or_empty_means_no_change() -> None:
    assert nixl_progress.delay_from_env({}) is None
    assert nixl_progress.delay_from_env({nixl_progress.ENV: " "}) is None



def test_the_real_nixl_agent_starts_with_the_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    nixl_api = pytest.importorskip("nixl._api")
    monkeypatch.setattr(nixl_api, "nixlBind", nixl_api.nixlBind)  # restored after the test
    monkeypatch.setenv(nixl_progress.ENV, "2000")
    nixl_progress.register()
    assert nixl_api.nixlBind._pdx_progress_delay_us == 2000
    agent = nixl_api.nixl_agent("pdx-test", nixl_api.nixl_agent_config(backends=["UCX"]))
    assert agent.name == "pdx-test"
