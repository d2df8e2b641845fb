"""A decode going away first lets its conversations move: its preStop, grace and settings."""

from __future__ import annotations

from typing import Any

from pdx.render import render
from pdx.render.engines import DRAIN_PROGRAM, SHUTDOWN_SECONDS
from tests.render.test_render import by_kind, target


def _pod(role: str, **changes: Any) -> dict[str, Any]:
    sts = by_kind(render(target(**changes)), "StatefulSet")[f"qwen3-32b-{role}"]
    pod: dict[str, Any] = sts["spec"]["template"]["spec"]
    return pod


def test_a_decode_drains_for_at_most_the_routers_entry_deadline_before_vllm_stops() -> None:
    pod = _pod("decode")
    (vllm,) = pod["containers"]
    assert vllm["lifecycle"] == {"preStop": {"exec": {"command": ["python3", DRAIN_PROGRAM]}}}
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["PDX_DRAIN_ROUTER"] == "http://qwen3-32b-router.inference.svc:8000"
    assert env["PDX_DRAIN_SECONDS"] == "450"  # the router's deadline for a 480 s decoder TTL
    assert pod["terminationGracePeriodSeconds"] == 450 + SHUTDOWN_SECONDS


def test_prefill_and_a_fleet_without_reuse_do_not_drain() -> None:
    for pod in (_pod("prefill"), _pod("decode", spec__kvTransfer__bidirectional=False)):
        (vllm,) = pod["containers"]
        assert "lifecycle" not in vllm and pod["terminationGracePeriodSeconds"] == SHUTDOWN_SECONDS
        assert not any(e["name"].startswith("PDX_DRAIN") for e in vllm["env"])
