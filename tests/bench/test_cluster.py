"""The cluster target against a fake Kubernetes API that plays a slow operator."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from pdx_bench.sweep import (
    GROUP,
    PLURAL,
    VERSION,
    ClusterTarget,
    Leg,
    RolloutTimeout,
    expected_config_hash,
    set_bidirectional,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local-cpu.yaml"


def _cr(bidirectional: bool) -> dict[str, Any]:
    doc: dict[str, Any] = set_bidirectional(yaml.safe_load(EXAMPLE.read_text()), bidirectional)
    doc["metadata"].update(namespace="ml", generation=3, uid="u-1")
    doc["status"] = _status(3, expected_config_hash(doc), ready=True)
    return doc


def _status(observed: int, config_hash: str | None, ready: bool) -> dict[str, Any]:
    return {
        "observedGeneration": observed,
        "configHash": config_hash,
        "routerAddress": "http://local-router.ml.svc:8000",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "x"}],
    }


class FakeOperatorApi:
    """CustomObjectsApi look-alike: a patch bumps generation; status catches up over polls.

    Poll 1 after a patch still shows the old status (Ready from before: a naive wait would
    stop here), poll 2 has observedGeneration but the old hash and not Ready, poll 3 is done.
    """

    def __init__(self, obj: dict[str, Any], polls_to_ready: int = 3) -> None:
        self.obj = obj
        self.patches: list[tuple[dict[str, Any], str | None]] = []
        self.gets = 0
        self.polls_to_ready = polls_to_ready
        self._since_patch: int | None = None

    def get_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str, name: str) -> dict[str, Any]:
        assert (group, version, ns, plural, name) == (GROUP, VERSION, "ml", PLURAL, "local")
        self.gets += 1
        if self._since_patch is not None:
            self._since_patch += 1
            gen = self.obj["metadata"]["generation"]
            old_hash = self.obj["status"]["configHash"]
            if self._since_patch == 2:
                self.obj["status"] = _status(gen, old_hash, ready=False)
            elif self._since_patch >= self.polls_to_ready:
                self.obj["status"] = _status(gen, expected_config_hash(self.obj), ready=True)
        return copy.deepcopy(self.obj)

    def patch_namespaced_custom_object(
        self, group: str, version: str, ns: str, plural: str, name: str, body: dict[str, Any], **kw: Any
    ) -> dict[str, Any]:
        self.patches.append((body, kw.get("_content_type")))
        _merge(self.obj, body)
        self.obj["metadata"]["generation"] += 1
        self._since_patch = 0
        return copy.deepcopy(self.obj)


def _merge(obj: dict[str, Any], patch: dict[str, Any]) -> None:
    """A JSON merge patch (RFC 7386) without deletions."""
    for key, value in patch.items():
        if isinstance(value, dict):
            _merge(obj.setdefault(key, {}), value)
        else:
            obj[key] = value


class FakeCore:
    def __init__(self, config_hash: str | None) -> None:
        self.hash = config_hash
        self.selectors: list[str] = []

    def list_namespaced_pod(self, ns: str, label_selector: str) -> Any:
        self.selectors.append(label_selector)
        role = "prefill" if "role=prefill" in label_selector else "decode"
        ip = "10.0.0.1" if role == "prefill" else "10.0.0.2"

        def pod(ip: str, h: str | None, phase: str = "Running") -> Any:
            return SimpleNamespace(
                metadata=SimpleNamespace(labels={"pdx.dev/config-hash": h}),
                status=SimpleNamespace(pod_ip=ip, phase=phase),
            )

        return SimpleNamespace(
            items=[pod(ip, self.hash), pod("10.9.9.9", "old-hash"), pod("10.8.8.8", self.hash, "Pending")]
        )


def _target(api: FakeOperatorApi, **kw: Any) -> tuple[ClusterTarget, list[float]]:
    sleeps: list[float] = []
    t = ClusterTarget(api, "ml", "local", poll_s=2.0, sleep=sleeps.append, **kw)
    return t, sleeps


def test_flip_patches_and_waits_for_the_new_config() -> None:
    api = FakeOperatorApi(_cr(True))
    target, sleeps = _target(api)
    obj = target.flip(False)
    assert api.patches == [({"spec": {"kvTransfer": {"bidirectional": False}}}, "application/merge-patch+json")]
    assert obj["spec"]["kvTransfer"]["bidirectional"] is False
    assert obj["status"]["observedGeneration"] == 4
    assert obj["status"]["configHash"] == expected_config_hash(_cr(False))
    assert obj["status"]["configHash"] != expected_config_hash(_cr(True))
    # It did not stop at the stale Ready (poll 1) nor at the new generation with the old hash (poll 2).
    assert api.gets == 1 + 3 and sleeps == [2.0, 2.0]


def test_a_named_leg_patches_its_fields_and_waits_for_the_router_alone() -> None:
    api = FakeOperatorApi(_cr(True))
    target, sleeps = _target(api)
    obj = target.apply(Leg("by-id", (("router.conversationFrom", "id"),)))
    assert api.patches == [({"spec": {"router": {"conversationFrom": "id"}}}, "application/merge-patch+json")]
    assert obj["spec"]["router"]["conversationFrom"] == "id"
    assert obj["status"]["configHash"] == expected_config_hash(_cr(True))  # the engines' generation is the same
    assert sleeps == [2.0, 2.0] and set(target.rollout_seconds) == {"by-id"}  # not at the stale Ready


def test_no_patch_when_already_set() -> None:
    api = FakeOperatorApi(_cr(True))
    target, sleeps = _target(api)
    target.flip(True)
    assert api.patches == [] and sleeps == []


def test_rollout_timeout() -> None:
    api = FakeOperatorApi(_cr(True), polls_to_ready=10**6)
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    target = ClusterTarget(api, "ml", "local", timeout_s=30, poll_s=5, sleep=sleep, clock=lambda: now[0])
    with pytest.raises(RolloutTimeout, match="not rolled out after 30s"):
        target.flip(False)
    assert 30 <= now[0] <= 35


def test_serve_yields_router_and_engines_of_the_new_config() -> None:
    api = FakeOperatorApi(_cr(True))
    want = expected_config_hash(_cr(False))
    core = FakeCore(want)
    target, _ = _target(api, core=core)
    with target.serve(False) as ep:
        assert ep.router_url == "http://local-router.ml.svc:8000"
        assert ep.engine_urls == {"prefill": ["http://10.0.0.1:8000"], "decode": ["http://10.0.0.2:8000"]}
        assert ep.served_model_name == "pdx-tiny"
    assert all("app.kubernetes.io/instance=local" in s for s in core.selectors)
    target2, _ = _target(FakeOperatorApi(_cr(True)), router_url="http://127.0.0.1:18000")
    with target2.serve(None) as ep2:
        assert ep2.router_url == "http://127.0.0.1:18000" and ep2.engine_urls == {}
