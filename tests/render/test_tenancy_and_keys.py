"""What the CR says about tenants and the engines' key reaches the router and the engines."""

from __future__ import annotations

import json
from typing import Any

from pdx.render import render
from pdx.render.router import router_config
from tests.render.test_render import ROOT, by_kind, target


def _router_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = by_kind(objects, "Deployment").values()
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def test_the_engine_key_goes_to_vllm_as_its_api_key_and_to_the_router_as_a_file() -> None:
    t = target(spec__engineApiKeySecret={"name": "engine-key", "key": "k"})
    objects = render(t)
    ref = {"secretKeyRef": {"name": "engine-key", "key": "k"}}
    for sts in by_kind(objects, "StatefulSet").values():
        (vllm,) = sts["spec"]["template"]["spec"]["containers"]
        assert {"name": "VLLM_API_KEY", "valueFrom": ref} in vllm["env"]
        assert not any("api-key" in a for a in vllm["args"])  # not on the command line
    pod = _router_pod(objects)
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"] == {"secretName": "engine-key", "items": [{"key": "k", "path": "api-key"}]}
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] and not any(e.get("name") == "VLLM_API_KEY" for e in pod["containers"][0].get("env", []))
    assert router_config(t, "g").engine_api_key_file == mount["mountPath"] + "/api-key"


def test_without_an_engine_key_nothing_of_one_is_rendered() -> None:
    objects = render(target())
    assert "VLLM_API_KEY" not in json.dumps(objects) and "engine-api-key" not in json.dumps(objects)


def test_the_deprecated_tenant_header_renders_as_the_gateway_identity() -> None:
    cfg = router_config(target(spec__router__tenantHeader="X-Tenant"), "g")
    assert (cfg.tenancy.identity, cfg.tenancy.header) == ("header", "X-Tenant")


def test_a_deployment_by_default_keys_tenants_on_the_api_key_and_tells_clients_nothing() -> None:
    cfg = router_config(target(), "g")
    assert cfg.tenancy.identity == "apiKey" and not cfg.reuse_headers


def test_the_local_demo_is_one_trusted_client_that_reads_the_reuse_facts() -> None:
    cfg = router_config(target(ROOT / "examples" / "local-cpu.yaml"), "g")
    assert cfg.tenancy.identity == "single" and cfg.reuse_headers


def test_conversations_are_found_by_id_or_history_unless_the_cr_says_otherwise() -> None:
    assert router_config(target(), "g").conversation_from == "both"
    cfg = router_config(target(spec__router__conversationFrom="id"), "g")
    assert cfg.conversation_from == "id" and cfg.to_json()["conversationFrom"] == "id"
