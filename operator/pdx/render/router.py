"""The router: its config (the contract pdx-router reads), Deployment and Service."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pdx.render import meta
from pdx.render.meta import HTTP_PORT, Role
from pdx.resource import Target

CONFIG_DIR = "/etc/pdx/router"
ENDPOINTS_DIR = "/etc/pdx/endpoints"
CONFIG_FILE = "router.json"
ENDPOINTS_FILE = "endpoints.json"


@dataclass(frozen=True)
class Endpoint:
    """A ready engine pod as the router addresses it."""

    role: Role
    name: str
    ip: str
    generation: str
    port: int = HTTP_PORT

    def url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}"


def router_config(target: Target, config_hash: str) -> dict[str, Any]:
    spec = target.spec
    router = spec.router
    store: dict[str, Any] = {"kind": router.store.kind}
    if router.store.url:
        store["url"] = router.store.url
    svc = f"{target.namespace}.svc"
    config: dict[str, Any] = {
        "host": "0.0.0.0",
        "port": router.port,
        "servedModelName": spec.model.served_name,
        "generation": config_hash,
        "prefill": [],
        "decode": [],
        "endpointsFile": f"{ENDPOINTS_DIR}/{ENDPOINTS_FILE}",
        "dns": {
            "prefill": f"{meta.engine_name(target, 'prefill')}.{svc}",
            "decode": f"{meta.engine_name(target, 'decode')}.{svc}",
            "port": HTTP_PORT,
            "refreshSeconds": 5,
        },
        "conversationTtlSeconds": spec.router_ttl,
        "kvRecomputeThreshold": spec.kv_transfer.kv_recompute_threshold,
        "maxEntries": router.max_entries,
        "tenantHeader": router.tenant_header,
        "store": store,
        "maxRequestBytes": 16 * 1024 * 1024,
        "upstreamTimeoutSeconds": 600,
        "healthCheckIntervalSeconds": 5,
    }
    if router.tokenizer == "router":
        config["tokenizer"] = spec.model.name
    return config


def endpoints_document(endpoints: list[Endpoint]) -> dict[str, Any]:
    return {
        "endpoints": [
            {"role": e.role, "url": e.url(), "generation": e.generation, "name": e.name}
            for e in sorted(endpoints, key=lambda e: (e.role, e.name))
        ]
    }


def _dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def router_configmap(target: Target, config_hash: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta.metadata(target, meta.router_name(target), "router"),
        "data": {CONFIG_FILE: _dump(router_config(target, config_hash))},
    }


def endpoints_configmap(target: Target, endpoints: list[Endpoint]) -> dict[str, Any]:
    """Kept current by the operator from ready pods; the router polls the mounted file."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta.metadata(target, meta.endpoints_name(target), "router"),
        "data": {ENDPOINTS_FILE: _dump(endpoints_document(endpoints))},
    }


def router_deployment(target: Target, config_hash: str) -> dict[str, Any]:
    router = target.spec.router
    config_digest = meta.canonical_hash(router_config(target, config_hash))
    res = router.resources
    resources: dict[str, Any] = {"requests": {}, "limits": {}}
    if res.cpu:
        resources["requests"]["cpu"] = res.cpu
        if res.limit_cpu:
            resources["limits"]["cpu"] = res.cpu
    if res.memory:
        resources["requests"]["memory"] = resources["limits"]["memory"] = res.memory
    container: dict[str, Any] = {
        "name": "router",
        "image": router.image.ref,
        "imagePullPolicy": router.image.pull_policy,
        "args": ["--config", f"{CONFIG_DIR}/{CONFIG_FILE}"],
        "ports": [{"name": "http", "containerPort": router.port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10},
        "resources": {k: v for k, v in resources.items() if v},
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "endpoints", "mountPath": ENDPOINTS_DIR, "readOnly": True},
        ],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [
            {"name": "config", "configMap": {"name": meta.router_name(target)}},
            {"name": "endpoints", "configMap": {"name": meta.endpoints_name(target)}},
        ],
    }
    cache = target.spec.model_cache
    if router.tokenizer == "router" and cache.claim_name:
        # Only the tokenizer files are read; the engines own the cache.
        container["volumeMounts"].append({"name": "model-cache", "mountPath": cache.mount_path, "readOnly": True})
        pod["volumes"].append(
            {"name": "model-cache", "persistentVolumeClaim": {"claimName": cache.claim_name, "readOnly": True}}
        )
    if router.image.pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in router.image.pull_secrets]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta.metadata(target, meta.router_name(target), "router"),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": meta.selector(target, "router")},
            "template": {
                "metadata": {
                    "labels": meta.labels(target, "router"),
                    # A changed config (TTL, generation) rolls the router.
                    "annotations": {meta.ANNOTATION_ROUTER_CONFIG: config_digest},
                },
                "spec": pod,
            },
        },
    }


def router_service(target: Target) -> dict[str, Any]:
    port = target.spec.router.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta.metadata(target, meta.router_name(target), "router"),
        "spec": {
            "selector": meta.selector(target, "router"),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
