"""The router: its config (the contract pdx-router reads), Deployment and Service."""

from __future__ import annotations

import json
import math
from typing import Any

from pdx import labels
from pdx.render import meta
from pdx.render.meta import HTTP_PORT, Role
from pdx.resource import Target
from pdx.rules import ROUTER_BASE_MEMORY_BYTES, STORE_OVERHEAD_FACTOR, quantity_value
from pdx.spec import RouterSpec
from pdx_contract.base import Document, engine_url
from pdx_contract.endpoints import EndpointsDocument, PublishedEndpoint
from pdx_contract.router_config import DnsConfig, RouterConfig, StoreConfig, TenancyConfig

CONFIG_DIR = "/etc/pdx/router"
ENDPOINTS_DIR = "/etc/pdx/endpoints"
ENGINE_KEY_DIR = "/etc/pdx/engine-key"
ENGINE_KEY_FILE = "api-key"
CONFIG_FILE = "router.json"
ENDPOINTS_FILE = "endpoints.json"


def ready_engine(
    role: Role, name: str, ip: str, generation: str, port: int = HTTP_PORT, draining: bool = False
) -> PublishedEndpoint:
    """A ready engine pod as the router addresses it."""
    return PublishedEndpoint(role=role, name=name, url=engine_url(ip, port), generation=generation, draining=draining)


def router_config(target: Target, config_hash: str) -> RouterConfig:
    spec = target.spec
    router = spec.router
    svc = f"{target.namespace}.svc"
    tenancy = router.effective_tenancy()
    return RouterConfig(
        host="0.0.0.0",
        port=router.port,
        served_model_name=spec.model.served_name,
        generation=config_hash,
        endpoints_file=f"{ENDPOINTS_DIR}/{ENDPOINTS_FILE}",
        dns=DnsConfig(
            prefill=f"{meta.engine_name(target, 'prefill')}.{svc}",
            decode=f"{meta.engine_name(target, 'decode')}.{svc}",
            port=HTTP_PORT,
        ),
        conversation_ttl_seconds=spec.router_ttl,
        kv_recompute_threshold=spec.kv_transfer.kv_recompute_threshold,
        max_entries=router.max_entries,
        tenancy=TenancyConfig(
            identity=tenancy.identity, header=tenancy.header, cache_isolation=tenancy.cache_isolation
        ),
        conversation_from=router.conversation_from,
        decode_local_max_tokens=spec.decode_local_max_tokens,
        decode_local_max_busy=router.decode_local_max_busy,
        decode_local_idle_max_tokens=spec.decode_local_idle_max_tokens,
        claim_queue_tokens=spec.claim_queue_tokens,
        first_token_from_prefill=router.first_token_from_prefill,
        prefill_affinity=spec.prefill_affinity,
        reuse_headers=router.reuse_headers,
        engine_api_key_file=f"{ENGINE_KEY_DIR}/{ENGINE_KEY_FILE}" if spec.engine_api_key_secret else None,
        store=StoreConfig(
            kind=router.store.kind,
            url=router.store.url,
            max_bytes=_bytes(router.store.max_bytes),
            max_bytes_per_tenant=_bytes(tenant) if (tenant := router.store.max_bytes_per_tenant) else None,
        ),
        tokenizer=spec.model.name if router.tokenizer == "router" else None,
    )


def _bytes(q: str) -> int:
    return max(1, int(quantity_value(q)))


def router_memory(router: RouterSpec) -> str:
    """The router's memory request and limit: as given, else what its entry store needs (the
    bound rules.py checks a given one against)."""
    if router.resources.memory:
        return router.resources.memory
    need = float(ROUTER_BASE_MEMORY_BYTES)
    if router.store.kind == "memory":
        need += STORE_OVERHEAD_FACTOR * _bytes(router.store.max_bytes)
    mib = math.ceil(need / 2**20)
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def endpoints_document(endpoints: list[PublishedEndpoint]) -> EndpointsDocument:
    return EndpointsDocument(endpoints=tuple(sorted(endpoints, key=lambda e: (e.role, e.name))))


def _dump(doc: Document) -> str:
    return json.dumps(doc.to_json(), indent=2, sort_keys=True) + "\n"


def router_configmap(target: Target, config_hash: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta.metadata(target, meta.router_name(target), "router"),
        "data": {CONFIG_FILE: _dump(router_config(target, config_hash))},
    }


def endpoints_configmap(target: Target, endpoints: list[PublishedEndpoint]) -> dict[str, Any]:
    """Kept current by the operator from ready pods; the router polls the mounted file."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta.metadata(target, meta.endpoints_name(target), "router"),
        "data": {ENDPOINTS_FILE: _dump(endpoints_document(endpoints))},
    }


def router_deployment(target: Target, config_hash: str) -> dict[str, Any]:
    router = target.spec.router
    config_digest = meta.canonical_hash(router_config(target, config_hash).to_json())
    res = router.resources
    resources: dict[str, Any] = {"requests": {}, "limits": {}}
    if res.cpu:
        resources["requests"]["cpu"] = res.cpu
        if res.limit_cpu:
            resources["limits"]["cpu"] = res.cpu
    resources["requests"]["memory"] = resources["limits"]["memory"] = router_memory(router)
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
            "runAsGroup": 65532,
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
    if (key := target.spec.engine_api_key_secret) is not None:
        # A file, not an environment variable: nothing in the pod spec or /proc/*/environ.
        container["volumeMounts"].append({"name": "engine-api-key", "mountPath": ENGINE_KEY_DIR, "readOnly": True})
        items = [{"key": key.key, "path": ENGINE_KEY_FILE}]
        pod["volumes"].append({"name": "engine-api-key", "secret": {"secretName": key.name, "items": items}})
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
                    "annotations": {labels.ROUTER_CONFIG_HASH: config_digest},
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
